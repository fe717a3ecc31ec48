"""--mode=plan (paxloom/launch/plan.py, paxloom/runner/planning/plan.py, paxloom/runner/planning/hlo_text.py): tiny plans on the 8 fake CPU devices,
the fit verdict and its re-planned changes, and the plan against a real run."""

import dataclasses
import json
import re

import jax
import pytest

import experiments
from paxloom.launch import plan
from paxloom.runner.planning import hlo_text
from paxloom.runner.planning import plan as planning
from tests.support import step_growth
from tests.support.processes import run_main, run_python, session_env
from tests.support.tiny import TINY
from tests.support.training import make_trainer

pytestmark = pytest.mark.usefixtures("compilation_cache")

# Big enough that activations, not the state, dominate the step's memory.
MEASURED = dict(ICI_MESH_SHAPE=[2, 2, 2], PERCORE_BATCH_SIZE=8, MAX_SEQ_LEN=128)


def tiny(**overrides):
    exp = experiments.BaseExperiment(**{**TINY, **overrides})
    return exp, exp.run_config()


@pytest.fixture(scope="module")
def measured_plan():
    return plan.plan(*tiny(**MEASURED))


def test_tiny_plan_counts_the_model_and_its_sharded_state(measured_plan, tmp_path):
    p = measured_plan
    assert (p.num_devices, p.global_batch, p.seq_len) == (8, 64, 128)
    assert p.mesh_shape == {"stage": 1, "replica": 2, "data": 2, "context": 1, "mdl": 2}
    trainer = make_trainer(tmp_path, **MEASURED)
    assert p.num_params == trainer.num_params
    assert p.flops_per_token == trainer.flops_per_token
    m = p.memory
    # 4-byte weights split 4 ways (data x mdl), replicated over replica (norm scales and
    # biases are not all split): about one byte per parameter. Adam has two moments of each.
    assert m.params == pytest.approx(p.num_params, rel=0.1)
    assert m.opt_state == pytest.approx(2 * m.params, rel=1e-3)
    # XLA's arguments are exactly the sharded state and batch; the donated state is reused.
    assert m.arguments == m.state + m.batch
    assert m.state - m.params - m.opt_state == 4  # the step counter
    assert m.aliased >= m.params + m.opt_state
    assert m.peak > m.analytic_floor


def test_tiny_plan_finds_each_collective_on_its_mesh_axis(measured_plan):
    by_axes = {(t.op, t.axes): t for t in measured_plan.traffic}
    # FSDP: weights are gathered over data; data parallelism: gradients summed over
    # replica; tensor parallelism: activations reduced over mdl. All within one node.
    assert ("all-gather", ("data",)) in by_axes
    assert ("all-reduce", ("replica",)) in by_axes
    assert ("all-reduce", ("mdl",)) in by_axes
    assert {t.links for t in measured_plan.traffic} == {"ICI"}
    gradients = by_axes[("all-reduce", ("replica",))]
    # The gradient of every weight crosses replica once: the state's float32 parameters.
    assert gradients.buffer_bytes >= measured_plan.memory.params
    assert gradients.sent_bytes == pytest.approx(gradients.buffer_bytes)  # 2(n-1)/n, n=2


@pytest.mark.process
def test_planned_program_is_the_one_that_runs_and_its_peak_matches(measured_plan, tmp_path):
    # In a fresh process (tests/support/step_growth.py): how much a step grows a process
    # depends on what the process did before, and this one has run other tests.
    env = session_env(JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir or "")
    out = run_python("-m", "tests.support.step_growth", json.dumps(MEASURED), str(tmp_path),
                     env=env, check=True)
    ran = json.loads(out.stdout.splitlines()[-1])
    assert ran["program"] == step_growth.program_digest(measured_plan.compiled)
    assert ran["analysed_peak_bytes"] == pytest.approx(measured_plan.memory.peak, rel=0.2)
    if ran["grown_bytes"] is not None:
        # Independently of XLA's analysis: the 8 devices' step grew the process by about
        # what the plan says each needs beyond its state (XLA:CPU's kernels and in-process
        # collectives add scratch memory the analysis does not count, hence the upper slack).
        grown = ran["grown_bytes"] / ran["devices"]
        planned = measured_plan.memory.peak - measured_plan.memory.arguments
        assert 0.8 * planned <= grown <= 1.5 * planned, (grown, planned)


def test_a_pile_experiment_plans_without_data_or_vocabulary():
    """The plan compiles the step alone: no --data_dir, no --vocab_path needed."""
    p = plan.plan(*tiny(DATASET="pile", LAMBADA_EVAL=True))
    assert p.memory.params > 0


def test_verdict_and_candidate_changes(measured_plan):
    p = measured_plan
    assert plan.fits(p, p.memory.peak) and not plan.fits(p, p.memory.peak - 1)
    remat, batch, accumulate, fsdp = plan.candidate_changes(dataclasses.replace(p, hyperparameters={
        **p.hyperparameters, "CHECKPOINT_POLICY": "none", "DCN_MESH_SHAPE": [2, 1, 1]})).values()
    assert [c["CHECKPOINT_POLICY"] for c, _ in remat] == list(plan.REMAT_LADDER[1:])
    # 8 devices and 4 batch shards (replica x data): halve down to 4 sequences per step.
    assert [c["PERCORE_BATCH_SIZE"] for c, _ in batch] == [4, 2, 1, 0.5]
    # The same 64 sequences per update in sub-batches that still split over the 4 shards.
    assert [c["GRADIENT_ACCUMULATION_STEPS"] for c, _ in accumulate] == [2, 4, 8, 16]
    assert [c for c, _ in fsdp] == [{"ICI_MESH_SHAPE": [1, 4, 2]},
                                    {"ICI_MESH_SHAPE": [1, 4, 2], "DCN_MESH_SHAPE": [1, 2, 1]}]


HLO = """\
HloModule m

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %ag = f32[64]{0} all-gather(%x), channel_id=1, replica_groups=[4,2]<=[4,2]T(1,0), dimensions={0}
  %ar = bf16[16]{0} all-reduce(%y), channel_id=2, replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}, to_apply=%add
}

%wrapped_convert (p0: bf16[4,8]) -> f32[4,8] {
  %p0 = bf16[4,8]{1,0} parameter(0)
  ROOT %c0 = f32[4,8]{1,0} convert(%p0)
}

%fused_add (p1: bf16[4,8]) -> f32[4,8] {
  %p1 = bf16[4,8]{1,0} parameter(0)
  %c1 = f32[4,8]{1,0} convert(%p1)
  ROOT %a1 = f32[4,8]{1,0} add(%c1, %c1)
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %b = bf16[4,8]{1,0} parameter(0)
  %up = f32[4,8]{1,0} fusion(%b), kind=kLoop, calls=%wrapped_convert
  %sum = f32[4,8]{1,0} fusion(%b), kind=kLoop, calls=%fused_add
  %up2 = f32[8,4]{1,0} convert(%b2)
  %w = (s32[], f32[8]) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %odd = f32[6]{0} all-to-all(%o), channel_id=6, replica_groups=someday
  %rs = f32[4]{0} reduce-scatter(%z), channel_id=3, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %ar2 = (f32[2], pred[]) all-reduce(%u, %v), channel_id=4, replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_0'}, to_apply=%add
  %cp = f32[10]{0} collective-permute(%q), channel_id=5, source_target_pairs={{0,4},{4,0},{1,1}}
}
"""


def test_collectives_read_every_replica_group_form_and_loop_counts():
    # Mesh replica=1 x data=4 x mdl=2; data is ICI 2 x DCN 2 (positions 0,1 | 2,3).
    traffic = hlo_text.step_traffic(HLO, {"replica": 1, "data": 4, "mdl": 2},
                                       [1, 2, 2], [1, 2, 1])
    got = {(t.op, t.axes): t for t in traffic}
    # Inside the loop: counted once per iteration. [4,2]<=[4,2]T(1,0) = {0,2},{4,6},{1,3},..
    gather = got[("all-gather", ("data",))]
    assert (gather.count, gather.group_size, gather.links) == (3, 2, "ICI")
    assert gather.buffer_bytes == 3 * 256 and gather.sent_bytes == 3 * 128
    # In the loop, iota ids on [4,2] varying the last axis: mdl, 3 x 32 bytes. In the entry,
    # device_ids [4,2]T(1,0) = 0,2,4,6,1,3,5,7 laid on [2,4], varying axis_0: pairs 0-1, 2-3,
    # ..., mdl again: a tuple of 8 + 1 bytes. Two devices: a ring sends the buffer once.
    reduce = got[("all-reduce", ("mdl",))]
    assert (reduce.count, reduce.buffer_bytes, reduce.sent_bytes) == (4, 105, 105)
    scatter = got[("reduce-scatter", ("data", "mdl"))]  # {} of all 8: a shard of 4 floats
    assert (scatter.links, scatter.buffer_bytes, scatter.sent_bytes) == ("ICI+DCN", 128, 112)
    permute = got[("collective-permute", ("data",))]  # 0 <-> 4: data position 0 <-> 2
    assert (permute.links, permute.sent_bytes) == ("DCN", 40)
    # A form of groups this parser does not know still counts its bytes, on no axis.
    unread = got[("all-to-all", ())]
    assert (unread.links, unread.group_size, unread.sent_bytes) == ("?", 0, 24)


def test_upcast_copies_are_whole_bfloat16_arrays_made_float32_outside_fusions():
    # %up converts %b whole; %sum is a fusion that does more than convert; the convert
    # inside %fused_add is no array in memory; %up2's operand is not in the program.
    assert hlo_text.upcast_copies(HLO) == [("f32[4,8]", 128)]


@pytest.mark.process
@pytest.mark.slow  # 27 s: a plan and its re-plans
def test_plan_from_the_command_line_does_not_fit_a_small_device_and_replans(
        measured_plan, monkeypatch):
    # The experiment of measured_plan, so the subprocess finds its step in this module's
    # compilation cache; on a device on which that plan misses by 10%.
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", jax.config.jax_compilation_cache_dir)
    memory_gb = 0.9 * measured_plan.memory.peak / planning.DEFAULT_MEM_FRACTION / 1e9
    assert not plan.fits(measured_plan,
                         plan.memory_budget(plan.DEVICE_KINDS["a100-40gb"], memory_gb))
    # measured_plan was planned with this CPU's attention (praxis); a plan for a GPU would
    # choose a fused kernel unless told, and need less memory.
    flags = [f"--fdl.{k}={v!r}" for k, v in {**TINY, **MEASURED, "ATTENTION_IMPL": "praxis"}.items()]
    out = run_main("--fdl_config=experiments.base.BaseExperiment", *flags, "--mode=plan",
                   "--plan_compiler=cpu",
                   "--plan_device=a100-40gb", f"--plan_device_memory_gb={memory_gb}")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for line in ("Plan: experiments.base.BaseExperiment on 8 devices", "FLOPs per token",
                 "peak (arguments + outputs - donated + temps)",
                 "Speed on 8 x A100 40GB (--plan_mfu=0.4 assumes an MFU instead)",
                 "Step time on A100 40GB (estimate)", "activations",
                 "nothing recorded for BaseExperiment", "Caveats"):
        assert line in text, line
    assert re.search(r"all-gather +data +ICI", text)
    assert re.search(r"A100 40GB \(given .* GB\) .* does not fit: .* over", text)
    assert re.search(r"H200 141GB .* fits: ", text)
    # Each kind of change re-planned: save_nothing already; half the batch fits (activations
    # dominate), so a quarter is not tried; the replica axis moved into FSDP.
    assert "rematerialisation (CHECKPOINT_POLICY): none to try" in text
    assert "--fdl.PERCORE_BATCH_SIZE=4: fits:" in text
    assert "PERCORE_BATCH_SIZE=2" not in text
    assert re.search(r"--fdl.ICI_MESH_SHAPE=\[1,4,2\]: (fits|does not fit)", text)
    assert ("To launch the first that fits (with this command line's other flags): python "
            "main.py --fdl_config=experiments.base.BaseExperiment --fdl.PERCORE_BATCH_SIZE=4 "
            "--job_log_dir=runs/NAME") in text


@pytest.mark.process
def test_plan_user_errors_are_one_line():
    out = run_main("--fdl_config=experiments.Tiny", "--mode=plan", "--plan_device=h300")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--plan_device=h300: one of h100, h200, a100-80gb" in lines[0]
    out = run_main("--fdl_config=experiments.Tiny", "--mode=plan", "--fdl.NUM_HEADS=3",
                   "--fdl.ICI_MESH_SHAPE=[1,1,2]")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not split over mesh axes mdl" in lines[0], out.stderr


def test_a_cudnn_run_plans_on_cpu_with_the_fused_kernels_memory():
    """ATTENTION_IMPL=cudnn plans on CPU devices (for an H100, as --mode=plan does): the
    fused kernel keeps no [T, T] scores, so at 512 tokens its step needs less memory than
    praxis's materialised attention."""
    shape = dict(ICI_MESH_SHAPE=[1, 1, 1], PERCORE_BATCH_SIZE=4, MAX_SEQ_LEN=512,
                 FPROP_DTYPE="bfloat16")
    peaks = {}
    for impl in ("praxis", "cudnn"):
        exp = experiments.BaseExperiment(**{**TINY, **shape, "ATTENTION_IMPL": impl})
        peaks[impl] = plan.plan(exp, exp.run_config(target=planning.target_device("h100"))).memory.temporaries
    # praxis keeps float32 scores per layer (4 x 8 x 512 x 512 x 4 bytes) and more.
    assert peaks["praxis"] - peaks["cudnn"] > 32 * 2**20, peaks


def test_changes_that_cannot_fit_cudnns_packed_buffers_are_not_compiled():
    """A re-plan whose cuDNN packed buffers (which grow with the rows a device runs at once)
    already exceed the budget is known not to fit before any compile."""
    from types import SimpleNamespace

    from paxloom.launch import plan as launch_plan

    memory = SimpleNamespace(kernel_buffers=100, state=10)
    p = SimpleNamespace(memory=memory, accumulation_steps=1,
                        hyperparameters={"PERCORE_BATCH_SIZE": 8})
    floor = launch_plan.kernel_buffer_floor
    assert floor(p, {"CHECKPOINT_POLICY": "save_nothing"}) == 110
    assert floor(p, {"PERCORE_BATCH_SIZE": 4}) == 60
    assert floor(p, {"GRADIENT_ACCUMULATION_STEPS": 4}) == 35
    assert floor(p, {"ICI_MESH_SHAPE": [1, 1, 8]}) == 100
    assert floor(p, {"MAX_SEGMENTS_PER_SEQ": 32}) == 0  # another bound: compiled
    memory.kernel_buffers = 0
    assert floor(p, {"CHECKPOINT_POLICY": "save_nothing"}) == 0
