"""`--mode=plan --plan_search` (paxloom/launch/layouts.py, paxloom/launch/plan_search.py): the
layouts enumerated where the experiment allows them, the ranking (a layout that does not fit
never above one that does), the estimate's terms, Pax's published A100 runs against the
estimate, and the search from the command line."""

import math
import re
import subprocess

import pytest

import experiments
from paxloom.launch import layouts, plan_search, resolve
from paxloom.runner.planning import efficiency, gpu_target
from paxloom.runner.planning import plan as planning
from tests.support.paths import REPO_ROOT
from tests.support.processes import PYTHON, run_main
from tests.support.tiny import TINY
from tests.test_step_time import assert_terms_add_up

pytestmark = pytest.mark.usefixtures("compilation_cache")

STAGE, REPLICA, DATA, MDL = layouts.STAGE, layouts.REPLICA, layouts.DATA, layouts.MDL


def enumerated(exp, nodes=2, gpus_per_node=4, global_batch=16):
    found, pruned = layouts.enumerate_layouts(exp, nodes, gpus_per_node, global_batch)
    assert found, pruned
    for layout in found:  # the tensor axis never crosses nodes
        assert layout.dcn[MDL] == 1, layout
    return found, pruned


# ----- Enumeration ---------------------------------------------------------------------------


def test_pipeline_and_expert_axes_appear_where_allowed():
    gpt = experiments.BaseExperiment(**{**TINY, "NUM_LAYERS": 4})
    found, _ = enumerated(gpt)
    pipelined = [x for x in found if x.size(STAGE) > 1]
    assert pipelined
    for layout in pipelined:
        overrides = layout.overrides()
        assert overrides["NUM_MICROBATCHES"] % layout.size(STAGE) == 0
        # Each a valid experiment, with the batch layout the flags say.
        variant = type(gpt)(**{**gpt.hyperparameters(), **overrides})
        assert variant.batch_layout().num_microbatches == layout.num_microbatches
    assert all("EXPERT_AXIS" not in x.overrides() for x in found)  # dense

    glam, glam_pruned = enumerated(experiments.resolve("experiments.GLaMTiny")())
    assert not [x for x in glam if x.size(STAGE) > 1]
    assert any(why.startswith("no pipeline stages") for why in glam_pruned), glam_pruned

    mixture, _ = enumerated(experiments.resolve("experiments.MixtralTiny")())
    axes = {x.overrides().get("EXPERT_AXIS") for x in mixture}
    assert {"data", "replica"} <= axes, axes
    for layout in mixture:
        if layout.expert_axis in ("data", "replica"):
            size = layout.size(DATA if layout.expert_axis == "data" else REPLICA)
            assert size > 1 and 8 % size == 0

    # The layouts picked for compiling include a pipelined one, and a tensor-parallel one.
    rows = [plan_search.Row(x, *layouts.analytic(gpt, x, "h100")) for x in found]
    rows.sort(key=lambda r: r.analytic.step_s)
    picked = plan_search.pick(rows, 4)
    assert len(picked) == 4 and picked[0] is rows[0]
    assert any(r.layout.size(STAGE) > 1 for r in picked)
    assert any(r.layout.size(MDL) > 1 for r in picked)


def test_layout_flags_are_the_overrides_as_the_command_line_writes_them():
    layout = layouts.Layout((2, 1, 2, 1, 2), (1, 1, 2, 1, 1), "save_nothing", accumulation=2,
                            num_microbatches=4, percore_batch_size=2.0)
    assert layout.overrides() == {
        "ICI_MESH_SHAPE": [2, 1, 2, 2], "DCN_MESH_SHAPE": [1, 1, 2, 1],
        "PERCORE_BATCH_SIZE": 2, "CHECKPOINT_POLICY": "save_nothing",
        "GRADIENT_ACCUMULATION_STEPS": 2, "NUM_MICROBATCHES": 4}
    assert layout.flags.startswith("--fdl.ICI_MESH_SHAPE=[2,1,2,2] --fdl.DCN_MESH_SHAPE=[1,1,2,1]")
    assert '--fdl.CHECKPOINT_POLICY="save_nothing"' in layout.flags
    assert layout.label == "PP2xFSDP4(2x2n)xTP2 M4 GA2 save_nothing"


# ----- Pax's published A100 runs --------------------------------------------------------------

PAX_A100 = {run.name: run for run in efficiency.PAX_A100_RUNS}  # Pax's GPU README, seed 002


def pax_layout(name):
    run = PAX_A100[name]
    layout = layouts.Layout(run.ici, run.dcn, run.checkpoint_policy,
                            percore_batch_size=run.percore_batch_size)
    exp = experiments.resolve(run.experiment)(**layout.overrides())
    return exp, layout, run.sequences_per_s


@pytest.mark.parametrize("name", PAX_A100)
def test_pax_published_layouts_within_25_percent_analytic(name):
    # The A100's efficiency scale is fitted on the 126M row alone; 5B and 175B are the check.
    exp, layout, published = pax_layout(name)
    _, estimate = layouts.analytic(exp, layout, "a100-80gb")
    sequences_per_s = estimate.tokens_per_s / exp.MAX_SEQ_LEN
    assert abs(sequences_per_s / published - 1) <= 0.25, (sequences_per_s, published)


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.skipif(not gpu_target.installed(),
                    reason="XLA:GPU's plugin is not installed (make install)")
def test_pax_published_layouts_within_25_percent_compiled():
    # Each compiled by XLA:GPU for an A100 80GB in a fresh process (15-60 s each).
    code = """
from paxloom.launch import plan as launch_plan, resolve
from paxloom.runner.planning import plan as planning, step_time
from tests.test_plan_search import pax_layout
planning.start(256, "gpu")
for name in ("126M", "5B", "175B"):
    exp, layout, published = pax_layout(name)
    config = resolve.experiment_graph(exp, resolve.Selection(), {}, planning.target_device("a100"))
    p = launch_plan.plan(exp, config, compiler="gpu", device="a100-80gb")
    e = step_time.from_plan(p, "a100-80gb", exp.MODEL_DIMS)
    print(name, e.tokens_per_s / exp.MAX_SEQ_LEN, published)
"""
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=900,
                         cwd=REPO_ROOT, env={"XLA_FLAGS": "", "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.split()[:1] and
            line.split()[0] in PAX_A100]
    assert len(rows) == 3, out.stdout
    for name, estimated, published in rows:
        assert abs(float(estimated) / float(published) - 1) <= 0.25, (name, estimated, published)


# ----- A small compiled search ----------------------------------------------------------------

# Big enough that activations, not the state, set the peak: layouts differ in memory.
SEARCHED = {**TINY, "NUM_LAYERS": 4, "MAX_SEQ_LEN": 128, "PERCORE_BATCH_SIZE": 8}


def small_search(device_memory_gb: float):
    exp = experiments.BaseExperiment(**SEARCHED)
    compiler = planning.start(8, "cpu")
    return plan_search.search(
        exp, resolve.Selection(), {}, planning.target_device("h100"), nodes=2,
        gpus_per_node=4, device="h100", compiler=compiler, global_batch=64, top_k=4,
        workers=1, device_memory_gb=device_memory_gb)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """The search at a memory between the compiled peaks: planned once at a large memory,
    then again (from the cache: XLA:CPU's plans do not depend on it) where only some fit."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        first = small_search(80.0)
        peaks = sorted(row.peak for row in first.rows if row.plan is not None)
        assert peaks[0] < peaks[-1], peaks
        between = math.sqrt(peaks[0] * peaks[-1]) if peaks[-1] < 2 * peaks[0] else 2 * peaks[0]
        result = small_search(between / planning.memory_fraction() / 1e9)
    return first, result


@pytest.mark.slow  # the search fixture compiles for about 30 s
def test_non_fitting_never_above_fitting(searched):
    first, result = searched
    assert all(row.cached for row in result.rows)  # the same layouts, planned once
    fits = [row.fits for row in result.rows]
    assert True in fits and False in fits, [(r.layout.label, r.peak) for r in result.rows]
    assert fits == sorted(fits, reverse=True)  # every fitting row before every other
    for row in result.rows:
        assert row.fits == (row.peak <= result.budget)
    fitting = [row.estimate.step_s for row in result.rows if row.fits]
    assert fitting == sorted(fitting)
    text = plan_search.report(result)
    assert result.rows[0].layout.flags in text.split("To launch the best")[1]


@pytest.mark.slow  # the search fixture's; tests/test_step_time.py adds up terms quickly
def test_report_terms_add_up(searched):
    _, result = searched
    text = plan_search.report(result)
    table = [line for line in text.splitlines() if re.match(r" +\d+  \S", line)]
    assert len(table) >= len(result.rows)
    for row in result.rows:
        assert_terms_add_up(row.estimate)
        assert row.layout.label in text
    assert "step " in text and "calibration:" in text and "layouts enumerated" in text


# ----- The command line ------------------------------------------------------------------------


@pytest.mark.process
def test_bad_search_flags_are_one_line():
    out = run_main("--fdl_config=experiments.Tiny", "--mode=plan", "--plan_search",
                   "--plan_top_k=0")
    assert out.returncode == 2 and "--plan_top_k" in out.stderr
    out = run_main("--fdl_config=experiments.Tiny", "--plan_search", "--job_log_dir=/tmp/x")
    assert out.returncode == 2 and "--mode=plan" in out.stderr


@pytest.mark.slow
@pytest.mark.process
def test_search_from_the_command_line(tmp_path):
    # XLA:GPU where installed (each of the 8 compiles 20-60 s on 2 cores), else XLA:CPU.
    out = run_main("--fdl_config=experiments.GPT5B", "--mode=plan", "--plan_search",
                   "--plan_nodes=4", env={"XLA_FLAGS": "", "XDG_CACHE_HOME": str(tmp_path)},
                   timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    ranked = [line for line in out.stdout.splitlines() if re.match(r" +\d+  [A-Z]", line)]
    assert len(ranked) >= 5, out.stdout
    launch = out.stdout.split("To launch the best")[1]
    assert "python main.py --fdl_config=experiments.gpt.GPT5B --fdl.ICI_MESH_SHAPE=" in launch


@pytest.mark.parametrize("compiler", ["gpu", "cpu"])
def test_cached_plans_are_keyed_by_the_xla_flags_they_compiled_with(compiler, monkeypatch):
    exp = experiments.BaseExperiment(**TINY)
    key = lambda: plan_search.cache_key(exp, exp.hyperparameters(), {}, "h100", 0.0, compiler)  # noqa: E731
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=false")
    cublas = key()
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=true")
    assert key() != cublas
