"""--mode=plan for pipelined runs (paxloom/launch/plan.py, paxloom/runner/planning/plan.py): the bubble of the schedule, the
stage-to-stage sends read from the compiled program and the links they cross, the
single changes that keep the stage axis; and GPT175BPipelined, the reference experiment
that needs pipelining, against its source and planned for its H100 cluster."""

import dataclasses
import math
import re

import pytest

import experiments
from paxloom.core import spec
from paxloom.launch import plan
from paxloom.runner.planning import plan as planning
from tests.support.processes import run_main
from tests.support.tiny import TINY

pytestmark = pytest.mark.usefixtures("compilation_cache")

# Stages within a node (ICI), GPipe, the update run as 2 sub-batches of 8: 4 microbatches
# of 2, each split over the 2 data shards of its stage.
GPIPE_ICI = dict(ICI_MESH_SHAPE=[2, 1, 2, 2], PERCORE_BATCH_SIZE=2, NUM_MICROBATCHES=4,
                 GRADIENT_ACCUMULATION_STEPS=2)
# Each stage on its own node (DCN), circular: 2 stages x 2 blocks of one layer.
CIRCULAR_DCN = dict(ICI_MESH_SHAPE=[1, 1, 2, 2], DCN_MESH_SHAPE=[2, 1, 1, 1], NUM_LAYERS=4,
                    CIRCULAR_REPEAT=2, PERCORE_BATCH_SIZE=2, NUM_MICROBATCHES=4)


def planned(**overrides) -> planning.Plan:
    exp = experiments.BaseExperiment(**{**TINY, **overrides})
    return plan.plan(exp, exp.run_config())


@pytest.fixture(scope="module")
def gpipe_ici():
    return planned(**GPIPE_ICI)


@pytest.fixture(scope="module")
def circular_dcn():
    return planned(**CIRCULAR_DCN)


def report_with_stage_sends(p, links: str) -> str:
    """The plan's report, once it is checked that the stages send each other bytes (the
    activations forward, their gradients back) over `links` only."""
    sends = p.stage_transfers
    assert sends and sum(t.sent_bytes for t in sends) > 0
    assert {t.links for t in sends} == {links}
    return "\n".join(planning.report_lines(p))


def test_gpipe_plan_reports_its_bubble_and_stage_sends_over_nvlink(gpipe_ici):
    p = gpipe_ici
    assert p.mesh_shape == {"stage": 2, "replica": 1, "data": 2, "context": 1, "mdl": 2}
    assert p.pipeline == spec.PipelineSpec(num_stages=2, num_microbatches=4)
    assert (p.global_batch, p.accumulation_steps, p.sub_batch) == (16, 2, 8)
    s, m = 2, 4
    assert p.bubble == pytest.approx((s - 1) / (m + s - 1))
    text = report_with_stage_sends(p, "ICI")  # stage 0 <-> stage 1 within the node
    assert "GRADIENT_ACCUMULATION_STEPS=2: 2 sub-batches of 8 sequences" in text
    assert "Pipeline: 2 stages, schedule GPipe (1 layer per stage)" in text
    assert "4 microbatches of 2 sequences per sub-batch (2 sub-batches per step)" in text
    assert "bubble (S-1)/(M+S-1) = 1/(4+1) = 20.0% of each stage's time idle" in text
    assert re.search(r"stage-to-stage transfers: .* sent per device per step, over ICI", text)


def test_circular_plan_across_nodes_sends_over_the_network(circular_dcn):
    p = circular_dcn
    assert p.pipeline == spec.PipelineSpec(num_stages=2, num_microbatches=4, circular_repeat=2)
    s, m, r = 2, 4, 2
    assert p.bubble == pytest.approx((s - 1) / (r * m + s - 1))
    text = report_with_stage_sends(p, "DCN")
    assert "schedule circular (CIRCULAR_REPEAT=2: each stage holds 2 blocks of 1 layer" in text
    assert "bubble (S-1)/(R*M+S-1) = 1/(2*4+1) = 11.1%" in text


def test_changes_of_a_pipelined_plan_keep_its_stages(circular_dcn):
    p = dataclasses.replace(circular_dcn, hyperparameters={
        **circular_dcn.hyperparameters, "ICI_MESH_SHAPE": [1, 2, 1, 2],
        "DCN_MESH_SHAPE": [2, 2, 1, 1]})
    changes = plan.candidate_changes(p)
    # The replica axis folds into FSDP; the stage entry stays first.
    assert [c for c, _ in changes["more FSDP (mesh)"]] == [
        {"ICI_MESH_SHAPE": [1, 1, 2, 2]},
        {"ICI_MESH_SHAPE": [1, 1, 2, 2], "DCN_MESH_SHAPE": [2, 1, 2, 1]}]
    # 16 sequences over 4 batch shards (stage x data): sub-batches of 8 and 4 still split.
    assert [c for c, _ in changes["gradient accumulation (GRADIENT_ACCUMULATION_STEPS)"]] == [
        {"GRADIENT_ACCUMULATION_STEPS": 2}, {"GRADIENT_ACCUMULATION_STEPS": 4}]
    # Microbatches of 4 -> 2 still split over the 2 data shards of a stage; 1 would not.
    (change, cost), = changes["more, smaller microbatches (pipeline)"]
    assert change == {"NUM_MICROBATCHES": 8}
    assert f"the bubble shrinks to {1 / (2 * 8 + 1):.1%}" in cost


# paxml paxml/tasks/lm/params/nvidia.py: NVIDIA175B(NVIDIA175BProxy(NVIDIA5B)), "175B config
# that works with 6x16 A100-40G"; the values GPT175BPipelined copies.
NVIDIA175B = dict(NUM_LAYERS=96, NUM_HEADS=96, DIMS_PER_HEAD=128, MODEL_DIMS=12288,
                  HIDDEN_DIMS=4 * 12288, MICROBATCH_SIZE=1, VOCAB_SIZE=51200,
                  MAX_SEQ_LEN=2048, FPROP_DTYPE="bfloat16", INIT_STD=0.023,
                  SOFTMAX_INIT_STD=0.023, CHECKPOINT_POLICY="save_nothing", STREAM_IO=False,
                  CIRCULAR_REPEAT=1, PACKED_INPUT=True)
NVIDIA175B_MESH = dict(DCN_MESH_SHAPE=[6, 1, 1, 1], ICI_MESH_SHAPE=[1, 1, 1, 16],
                       NUM_STAGES=6, PERCORE_BATCH_SIZE=0.0625)


def test_gpt175b_pipelined_values_are_nvidia175b_and_gpt175b():
    exp = experiments.resolve("experiments.GPT175BPipelined")()
    for key, value in NVIDIA175B.items():
        assert getattr(exp, key) == value, key
    # The differences, each stated in the docstring: 8 GPUs per node instead of 16, so
    # twice the stages over the same 96 GPUs; stages across nodes, tensor parallelism within.
    assert exp.ICI_MESH_SHAPE == [1, 1, 1, 8] and exp.DCN_MESH_SHAPE == [12, 1, 1, 1]
    assert exp.num_stages() == 12
    devices = math.prod(exp.ICI_MESH_SHAPE) * math.prod(exp.DCN_MESH_SHAPE)
    assert devices == math.prod(NVIDIA175B_MESH["ICI_MESH_SHAPE"]) * math.prod(
        NVIDIA175B_MESH["DCN_MESH_SHAPE"]) == 96
    # GPT175B's global batch (6 x 256 = 1536), in 8 sub-batches.
    gpt175b = experiments.resolve("experiments.GPT175B")()
    assert exp.PERCORE_BATCH_SIZE * devices == gpt175b.PERCORE_BATCH_SIZE * 256 == 1536
    assert exp.GRADIENT_ACCUMULATION_STEPS == 8
    # Everything else is GPT175B's (its optimizer, schedule and repeated layer).
    own = {"ICI_MESH_SHAPE", "DCN_MESH_SHAPE", "MICROBATCH_SIZE", "PERCORE_BATCH_SIZE",
           "GRADIENT_ACCUMULATION_STEPS", "VOCAB_SIZE"}
    for key, value in gpt175b.hyperparameters().items():
        if key not in own:
            assert getattr(exp, key) == value, key


@pytest.mark.process
@pytest.mark.slow  # 18 s: a compile of GPT175B's 96-device pipelined step
def test_gpt175b_pipelined_plans_to_fit_h100_80gb():
    """The whole 96-GPU plan from the command line (a subprocess: 96 fake devices)."""
    out = run_main("--fdl_config=experiments.GPT175BPipelined", "--mode=plan", timeout=600)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert ("Plan: experiments.gpt.GPT175BPipelined on 96 devices, mesh stage=12 x replica=1 "
            "x data=1 x context=1 x mdl=8") in text
    assert "8 sub-batches of 192 sequences" in text
    assert "Pipeline: 12 stages, schedule GPipe (8 layers per stage)" in text
    assert "bubble (S-1)/(M+S-1) = 11/(192+11) = 5.4%" in text
    assert re.search(r"stage-to-stage transfers: [\d.]+ GiB sent per device per step, over DCN",
                     text)
    assert re.search(r"peak \(arguments \+ outputs - donated \+ temps\) +\d", text)
    assert re.search(r"H100 80GB +[\d.]+ GiB usable +fits: ", text)
    assert "Single changes" not in text  # it fits: nothing to re-plan
