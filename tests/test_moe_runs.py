"""A tiny mixture of experts (experiments.MixtralTiny: layers/moe.py's dropless MoE in every
layer, 8 experts, top-2, split over the mesh's `data` axis) through the runs every other
model gets (issue 32's acceptance), each by the machinery and checks of the dense model's
tests, called with MoE settings:

- killed with SIGKILL after a checkpoint, started again: bitwise the uninterrupted run
  (tests/test_checkpoints_process.py);
- two jax.distributed processes, the experts split over both: the losses and evaluation of
  one process (tests/test_multiprocess.py);
- a checkpoint saved on [1,8,1] restores onto other meshes and fewer devices
  (tests/test_checkpoints.py);
- the step line, TensorBoard and metrics.jsonl show the router's metrics;
- the cached decoder against praxis's forward pass (tests/test_decode.py), and --mode=decode
  of a trained mixture;
- LoRA on attention trains only the adapters (tests/test_lora.py); on every layer, refused;
- evaluation on Pile-format data and Lambada, then --mode=eval and --mode=decode.
"""

import json
import re

import jax
import numpy as np
import pytest

from experiments.llama import MixtralTiny
from paxloom.runner.state import checkpoints
from tests import test_decode, test_lora
from tests.support.data import make_pile_dir, tiny_vocab_path
from tests.support.inference import save_job
from tests.support.processes import (
    assert_one_line,
    free_port,
    isolated_env,
    main_commands,
    run_job,
    run_main,
)
from tests.support.tiny import SHORT_PILE_RUN, TINY, fdl_flags, model_flags, tiny, tiny_flags
from tests.support.training import make_trainer
from tests.test_checkpoints import assert_bitwise_equal
from tests.test_checkpoints_process import assert_sigkill_then_rerun_matches_an_uninterrupted_run
from tests.test_multiprocess import RTOL, RUN, STEPS, max_rel_diff, train_and_evaluate

pytestmark = pytest.mark.usefixtures("compilation_cache")

EXPERIMENT = "--fdl_config=experiments.MixtralTiny"
# The tiny model's experts: 8, each 32 wide (MixtralTiny's top-2 routing and router losses).
# No Lambada unless a test gives it data.
MOE = dict(NUM_EXPERTS=8, MOE_HIDDEN_DIMS=32, LAMBADA_EVAL=False)
# The experts split 8 ways: each device holds one.
EXPERTS_OVER_8 = dict(ICI_MESH_SHAPE=[1, 8, 1], PERCORE_BATCH_SIZE=1)
METRICS = ("moe/load_balancing_loss", "moe/router_z_loss", "moe/dropped_fraction",
           "moe/max_expert_load")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """As tests/test_checkpoints_process.py's: 8 fake CPU devices and a compilation cache
    shared by this module's main.py runs."""
    return isolated_env(8, compilation_cache=str(tmp_path_factory.mktemp("jax_cache")))


def moe_trainer(tmp_path, devices=None, **overrides):
    """A Trainer of the tiny mixture (TINY, MOE and `overrides`), as make_trainer's."""
    return make_trainer(tmp_path, devices=devices, experiment=MixtralTiny,
                        **{**MOE, **overrides})


# A job of the tiny mixture trained by main.py on synthetic data, experts over 8 devices,
# with a learning rate that moves the weights from step 2 on: checkpoints at 2 and 4.
JOB = tiny(**MOE, **EXPERTS_OVER_8, MAX_STEPS=4, SUMMARY_INTERVAL_STEPS=1,
           CHECKPOINT_EVERY_N_STEPS=2, LEARNING_RATE=3e-3, LR_COS_WARMUP=1,
           LR_COS_DECAY_START=1, LR_COS_DECAY_END=100)


@pytest.fixture(scope="module")
def moe_job(tmp_path_factory, env):
    """(job_log_dir, console) of JOB."""
    job_dir = tmp_path_factory.mktemp("moe_job")
    out = run_main(EXPERIMENT, f"--job_log_dir={job_dir}", *fdl_flags(**JOB), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return job_dir, out.stdout


# ----- (1) kill -9, then resume: bitwise the uninterrupted run --------------------------------

# tests/test_checkpoints_process.py's run (the sample corpus through the real text input
# pipeline, 16 steps, a checkpoint every 2) with the tiny model's shapes and experts: `start`
# runs experiments.Tiny, and main.py takes the last --fdl_config.
SIGKILL_FLAGS = [EXPERIMENT, *model_flags(VOCAB_SIZE=None), *fdl_flags(**MOE)]


@pytest.mark.process
@pytest.mark.slow  # about 28 s; tests/test_checkpoints_process.py does the same for Tiny quickly
def test_a_mixture_killed_after_a_checkpoint_resumes_bitwise(tmp_path, env):
    out, state = assert_sigkill_then_rerun_matches_an_uninterrupted_run(tmp_path, env,
                                                                       *SIGKILL_FLAGS)
    assert "training MixtralTiny" in out and "moe/load_balancing_loss" in out
    assert "wi_gate" in state["params"]["lm"]["transformer"]["x_layers_0"]["ff_layer"]


# ----- (2) two processes, the experts split over both: the losses of one ----------------------


@pytest.mark.process
@pytest.mark.multiprocess
@pytest.mark.slow  # two main.py processes and the reference: 29-39 s on 2 cores
def test_two_processes_with_the_experts_split_over_both_train_like_one(tmp_path):
    """2 processes x 4 devices, DCN [1,2,1] x ICI [1,4,1]: the `data` axis, and so the 8
    experts, spans both processes (the all_to_all crosses them); against one process with
    the experts over its 8 devices (tests/test_multiprocess.py's run and tolerance)."""
    run = dict(RUN, **MOE)
    one = train_and_evaluate(moe_trainer(tmp_path / "one", ICI_MESH_SHAPE=[1, 8, 1], **run))
    port = free_port()
    run_job(main_commands(2, EXPERIMENT, f"--job_log_dir={tmp_path}/job",
                          *fdl_flags(**run, ICI_MESH_SHAPE=[1, 4, 1], DCN_MESH_SHAPE=[1, 2, 1],
                                     SUMMARY_INTERVAL_STEPS=1, EVAL_INTERVAL_STEPS=STEPS),
                          port=port),
            devices=4, log_dir=tmp_path / "logs")
    records = [json.loads(line) for line in
               (tmp_path / "job" / "tb" / "train" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == STEPS
    print(f"2x4 DCN[1,2,1] ICI[1,4,1] losses {losses} vs one process {one['losses']}: "
          f"max rel diff {max_rel_diff(losses, one['losses']):.2e}")
    assert max_rel_diff(losses, one["losses"]) < RTOL
    assert all(set(METRICS) <= set(r) for r in records if "loss" in r)
    evals = [json.loads(line) for line in
             (tmp_path / "job" / "tb" / "eval" / "metrics.jsonl").read_text().splitlines()]
    expected = one["eval"]["synthetic_eval"]
    (evaluation,) = [r for r in evals if "synthetic_eval/loss" in r]
    assert evaluation["synthetic_eval/loss"] == pytest.approx(expected["loss"], rel=RTOL)


# ----- (3) a checkpoint of [1,8,1] restores onto other meshes and fewer devices ---------------


@pytest.mark.process
@pytest.mark.parametrize("ici, num_devices", [([2, 2, 2], 8), ([8, 1, 1], 8), ([1, 1, 1], 1),
                                              ([1, 4, 1], 4)],
                         ids=["2x2x2", "8x1x1", "one-device", "1x4x1-on-4"])
def test_a_mixture_restores_onto_another_mesh_or_fewer_devices(tmp_path, moe_job, ici,
                                                               num_devices):
    """tests/test_checkpoints.py's test on the mixture: the experts saved one per device
    come back split 2 or 4 ways, or whole on each device."""
    saved = checkpoints.job_checkpoint_dir(str(moe_job[0]))
    other = moe_trainer(tmp_path, devices=jax.devices()[:num_devices], ICI_MESH_SHAPE=ici)
    restored = checkpoints.restore(saved, None, other.abstract_state)
    step, expected = checkpoints.load_numpy(saved)
    assert step == JOB["MAX_STEPS"]
    assert_bitwise_equal(restored.state, expected)
    restored_shardings = jax.tree_util.tree_map(lambda a: a.sharding, restored.state)
    assert restored_shardings == other.state_shardings
    wi_gate = restored.state["params"]["lm"]["transformer"]["x_layers_0"]["ff_layer"]["wi_gate"]
    assert wi_gate.shape == (8, 64, 32)
    shard_experts = {index[0].indices(8)[1] - index[0].indices(8)[0] for index in
                     wi_gate.sharding.devices_indices_map(wi_gate.shape).values()}
    assert shard_experts == {8 // ici[1]}


# ----- (4) the router's metrics in the step line, TensorBoard and metrics.jsonl ---------------


@pytest.mark.process
def test_the_step_line_and_the_summaries_show_the_moe_metrics(moe_job):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    job_dir, console = moe_job
    # The start line says where the experts are: split over the 8-way data axis.
    assert re.search(rf"^training MixtralTiny: .*, {MOE['NUM_EXPERTS']} experts over mesh axis "
                     rf"'data' \({MOE['NUM_EXPERTS'] // 8} per device\), steps 0 -> 4$",
                     console, re.M), console[:2000]
    lines = re.findall(r"^step +\d+ \| loss .*$", console, re.M)
    assert len(lines) == JOB["MAX_STEPS"], console
    for line in lines:
        for name in METRICS:
            assert re.search(rf"\| {name} [\d.e+-]+( |$)", line), line
    records = [json.loads(line) for line in
               (job_dir / "tb" / "train" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for record in steps:
        assert set(METRICS) <= set(record), record
        assert all(np.isfinite(record[name]) for name in METRICS)
        assert record["moe/dropped_fraction"] == 0.0  # dropless
        assert record["moe/max_expert_load"] >= 1.0  # the busiest expert over the mean
        assert record["moe/router_z_loss"] > 0.0
    events = EventAccumulator(str(job_dir / "tb" / "train"))
    events.Reload()
    assert set(METRICS) <= set(events.Tags()["scalars"])
    for name in METRICS:
        scalars = events.Scalars(name)
        assert [e.step for e in scalars] == [r["step"] for r in steps]
        assert [e.value for e in scalars] == pytest.approx([r[name] for r in steps])


# ----- (5) decoding --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moe_jobs(tmp_path_factory):
    """tests/test_decode.py's `jobs` for the mixture: (exp, job_dir, params, trainer) of a
    checkpoint with random parameters, on test_decode's mesh (experts split 2 ways)."""
    saved = {}

    def get(family):
        assert family == "mixtral"
        if not saved:
            exp = MixtralTiny(**{**TINY, **test_decode.MESH, **MOE})
            job_dir = tmp_path_factory.mktemp(family)
            params, trainer = save_job(job_dir, exp)
            assert "router" in params["lm"]["transformer"]["x_layers_0"]["ff_layer"]
            saved.update(job=(exp, str(job_dir), params, trainer))
        return saved["job"]

    return get


def test_greedy_decoding_of_a_mixture_equals_argmax_of_the_praxis_forward_pass(moe_jobs):
    test_decode.test_greedy_decoding_equals_argmax_of_the_praxis_forward_pass(moe_jobs,
                                                                             "mixtral")


def test_cached_logits_of_a_mixture_equal_praxis_logits(moe_jobs):
    test_decode.test_cached_logits_equal_praxis_logits_prefill_and_steps(moe_jobs, "mixtral")


# ----- (6) LoRA --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora_trainers(tmp_path_factory):
    """tests/test_lora.py's `trainers` for the mixture, with its settings (scanned layers,
    which test_lora's "llama_gqa" checks expect): the base, and adapted on attention."""
    built = {}

    def get(family, target=None):
        assert family == "llama_gqa" and target in (None, "attention")
        if target not in built:
            _, overrides = test_lora.settings(family, target)
            built[target] = make_trainer(tmp_path_factory.mktemp("lora"),
                                         experiment=MixtralTiny, **{**overrides, **MOE})
        return built[target]

    return get


@pytest.mark.slow  # two train steps compiled: 12-23 s on 2 cores; test_lora covers the method
def test_lora_on_attention_of_a_mixture_trains_only_the_adapters(lora_trainers):
    """tests/test_lora.py's test on the mixture: adapters on query, key, value and post
    only; the first loss is the base's to the bit; the experts and router never move."""
    adapted = lora_trainers("llama_gqa", "attention")
    ff_layer = adapted.abstract_state["params"]["lm"]["transformer"]["repeat"]["sub"][
        "x_layers_0"]["ff_layer"]
    assert {"router", "wi_gate", "wi_up", "wo"} <= set(ff_layer)
    test_lora.test_starts_equal_to_the_base_and_only_the_adapters_train(
        lora_trainers, "llama_gqa", "attention")


@pytest.mark.process
def test_lora_on_every_layer_of_a_mixture_is_refused_in_one_line(tmp_path):
    out = run_main(EXPERIMENT, "--fdl.USE_LORA=True", "--fdl.LORA_TARGET_LAYERS='all'",
                   f"--job_log_dir={tmp_path / 'job'}")
    assert_one_line(out, "USE_LORA on a mixture of experts: adapters go on attention only; "
                         "set LORA_TARGET_LAYERS='attention' (is 'all')")
    assert not (tmp_path / "job").exists()


# ----- (7) the Pile and Lambada; then --mode=eval and --mode=decode of the trained run -------


@pytest.mark.process
@pytest.mark.slow  # three main.py runs: 18-29 s on 2 cores
def test_a_mixture_on_pile_data_evaluates_on_pile_and_lambada_then_decodes(tmp_path, env,
                                                                          tmp_path_factory):
    """SHORT_PILE_RUN (tests/support/tiny.py) on make_pile_dir's data, then --mode=eval and
    --mode=decode from the run's record (tests/test_early_checks.py's pattern)."""
    data = make_pile_dir(tmp_path / "data", num_train_files=1, docs_per_file=40)
    vocab = tiny_vocab_path(tmp_path_factory)
    run_dir = tmp_path / "run"
    out = run_main(EXPERIMENT, f"--data_dir={data}", f"--vocab_path={vocab}",
                   f"--job_log_dir={run_dir}",
                   *tiny_flags(**{**SHORT_PILE_RUN, **MOE, **EXPERTS_OVER_8, "VOCAB_SIZE": 320,
                                  "LAMBADA_EVAL": True, "LAMBADA_MAX_EXAMPLES": 8,
                                  "CHECKPOINT_EVERY_N_STEPS": 0}), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"^step +4 \| loss [\d.]+ .*\| moe/load_balancing_loss ", out.stdout, re.M)
    for evaluation in ("eval pile_val | loss", "eval lambada | accuracy"):
        assert evaluation in out.stdout, out.stdout[-3000:]

    out = run_main("--mode=eval", f"--job_log_dir={run_dir}", env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "eval pile_val | loss" in out.stdout and "eval lambada | accuracy" in out.stdout

    out = run_main("--mode=decode", f"--job_log_dir={run_dir}", "--prompt=the river",
                   "--prompt=a harbor", "--max_decode_steps=6", env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in
               (run_dir / "decode_outputs.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == ["the river", "a harbor"]
    # Four steps teach it little (it may well continue with spaces), but it continues.
    for record in records:
        assert record["tokens"] == 6 and record["stop"] == "max_decode_steps", record
        assert record["checkpoint_step"] == 4 and record["continuation"], record
