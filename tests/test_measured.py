"""layers/measured.py: the table of paths measured on a GPU, and the choice 'auto' makes
from it, on the real table and on made-up ones that move the choice."""

import pytest

from layers import attention, measured

HOPPER_PACKED = measured.Case(packed=True, grouped_kv=False, dtype="bfloat16", context=False,
                              hopper=True)


def row(path, mfu, experiment="Synthetic126M", trained=True, gpu_tests_pass=True, **case):
    return {"kind": "attention", "path": path, "mfu": mfu, "experiment": experiment,
            "trained": trained, "gpu_tests_pass": gpu_tests_pass,
            "case": {**vars(HOPPER_PACKED), **case}}


def test_the_table_is_well_formed_and_dated():
    for r in measured.rows():
        measured.check_row(r)
        assert r["date"].startswith("20") and r["jax"].count(".") == 2, r
        assert r["kind"] != "attention" or r["path"] in attention.IMPLS, r


def test_the_fastest_working_path_on_the_shared_experiment_wins():
    table = [row("praxis", 0.20), row("xla", 0.18), row("cudnn", 0.32),
             row("cudnn", 0.48, experiment="GPT1_3B")]
    assert measured.choose("attention", HOPPER_PACKED, attention.IMPLS, table) == "cudnn"
    # A faster path counts only when it trained and passed its GPU checks.
    for broken in (dict(trained=False), dict(gpu_tests_pass=False)):
        faster = table + [row("pallas", 0.40, **broken)]
        assert measured.choose("attention", HOPPER_PACKED, attention.IMPLS, faster) == "cudnn"
    faster = table + [row("pallas", 0.40)]
    assert measured.choose("attention", HOPPER_PACKED, attention.IMPLS, faster) == "pallas"
    # ... and only among the paths allowed there.
    assert measured.choose("attention", HOPPER_PACKED, ("praxis", "xla"), table) == "praxis"


def test_packed_runs_cover_unpacked_rows_not_the_reverse():
    unpacked = measured.Case(**{**vars(HOPPER_PACKED), "packed": False})
    assert measured.choose("attention", unpacked, attention.IMPLS, [row("xla", 0.3)]) == "xla"
    table = [row("cudnn", 0.4, packed=False)]
    assert measured.choose("attention", HOPPER_PACKED, attention.IMPLS, table) == "praxis"


@pytest.mark.parametrize("context,portable", [(False, "praxis"), (True, "flash")])
def test_nothing_measured_takes_the_portable_path_and_says_so(context, portable):
    case = measured.Case(packed=True, grouped_kv=False, dtype="float32", context=context,
                         hopper=False)
    assert measured.choose("attention", case, attention.IMPLS) == portable
    note = attention.start_note("auto", portable, case)
    assert note.startswith("note: no GPU has measured") and f"'auto' takes '{portable}'" in note
    named = attention.start_note("pallas", "pallas", case)
    assert "'pallas' has not been measured" in named and "because it was named" in named
    assert attention.start_note("auto", "cudnn", HOPPER_PACKED) is None


def test_a_malformed_row_is_refused_in_one_line():
    with pytest.raises(ValueError, match="lacks command"):
        measured.check_row({k: 1 for k in measured.ROW_FIELDS if k != "command"})


def test_the_fastest_run_of_an_experiment_on_a_gpu():
    # Three Llama1B remat policies and two earlier runs trained on one H200: the plan's
    # speed section names the fastest by MFU (save_dot_with_no_batch_dims, 2026-11-27).
    run = measured.fastest_run("Llama1B", "H200")
    assert run["tokens_per_s"] == 56441 and "save_dot_with_no_batch_dims" in run["command"]
    assert measured.fastest_run("Llama1B", "A100") is None
    assert measured.fastest_run("NoSuchExperiment", "H200") is None
