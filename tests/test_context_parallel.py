"""Context parallelism (a `context` mesh axis: each sequence split over devices; issue 33):
the load-balanced token order, the attention across shards, and the runs around them, each
against the same run without the context axis on the 8 fake CPU devices.

- the order (paxloom/core/sequence_order.py) gives every shard the same causal work, and the plain
  order does not;
- losses and gradients of the GPT and of a grouped-query Llama, on packed and unpacked rows,
  with context parallelism 2, 4 and 8, alone and with FSDP and tensor parallelism, keys and
  values gathered or passed around a ring, equal the run without it (float32, highest matmul precision), and stop equalling it when the
  model sees another order than the attention assumes;
- training steps and evaluation equal, with gradient accumulation, dropless experts and
  pipeline stages too; a run killed with SIGKILL resumes bitwise; its checkpoint restores
  onto a mesh without the context axis;
- what cannot run gets one line.
"""

import jax
import numpy as np
import pytest

import experiments
from experiments.llama import LlamaBase, MixtralTiny
from layers import flash
from paxloom.core import sequence_order
from paxloom.core.errors import UserError
from paxloom.runner.state import checkpoints
from tests.support.processes import assert_one_line, isolated_env, run_main
from tests.support.tiny import fdl_flags, model_flags, tiny
from tests.support.training import make_trainer, run_steps
from tests.test_checkpoints import assert_bitwise_equal
from tests.test_checkpoints_process import assert_sigkill_then_rerun_matches_an_uninterrupted_run

pytestmark = pytest.mark.usefixtures("compilation_cache")

RTOL = 1e-5  # float32 with the highest matmul precision: only the order of sums differs
FAMILIES = {"gpt": (experiments.BaseExperiment, {}),
            "llama-gqa": (LlamaBase, dict(NUM_KV_HEADS=2))}  # 8 query heads over 2


# ----- the order ------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [2, 4, 8])
def test_the_load_balanced_order_gives_every_shard_the_same_causal_work(shards):
    seq_len = 64
    order = sequence_order.load_balanced_order(seq_len, shards)
    assert sorted(order) == list(range(seq_len))
    work = sequence_order.causal_work(order, shards)
    assert len(set(work)) == 1, work
    # The check tells the plain order apart: its last shard does 2N - 1 times the first's.
    plain = sequence_order.causal_work(np.arange(seq_len), shards)
    assert len(set(plain)) == shards and plain[-1] > plain[0]


def test_the_order_puts_chunks_i_and_2n_minus_1_minus_i_on_shard_i():
    order = sequence_order.load_balanced_order(8, 2)  # chunks of 2 tokens
    np.testing.assert_array_equal(order, [0, 1, 6, 7, 2, 3, 4, 5])


def test_documents_come_back_from_positions_in_any_order():
    # Two rows: documents of 3, 4 and 6 tokens then 3 of padding; one 16-token document.
    positions = np.array([[0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 0, 0], list(range(16))])
    order = sequence_order.load_balanced_order(16, 4)
    found = np.asarray(flash.segment_ids_from_positions(positions[:, order], order))
    expected = np.array([[1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 4, 5, 6], [1] * 16])
    np.testing.assert_array_equal(found, expected[:, order])


# ----- losses and gradients against the run without a context axis ----------------------------


def batch(packed: bool, rows=8, seq_len=64, seed=0) -> dict:
    """A [rows, seq_len] batch with 1 to 4 documents per row (or one per row), then 5 tokens
    of padding."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 512, (rows, seq_len)).astype(np.int32)
    segment_ids = np.zeros((rows, seq_len), np.int32)
    segment_pos = np.zeros((rows, seq_len), np.int32)
    real = seq_len - 5
    for row in range(rows):
        cuts = sorted(rng.choice(np.arange(1, real), rng.integers(0, 4), replace=False))
        bounds = [0, *cuts, real] if packed else [0, real]
        for doc, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            segment_ids[row, start:stop] = doc + 1
            segment_pos[row, start:stop] = np.arange(stop - start)
    weights = (segment_ids > 0).astype(np.float32)
    ids = np.where(weights > 0, ids, 0)
    return dict(ids=ids, labels=np.roll(ids, -1, axis=1), weights=weights,
                paddings=1 - weights, segment_ids=segment_ids, segment_pos=segment_pos)


def loss_and_grads(tmp_path, family: str, packed: bool, ici, impl: str = "auto",
                   reordered: bool = True, strategy: str = "all_gather"):
    """The loss and gradients of one step's batch at the initial parameters."""
    experiment, overrides = FAMILIES[family]
    trainer = make_trainer(tmp_path, experiment=experiment, ICI_MESH_SHAPE=ici,
                           ATTENTION_IMPL=impl, PACKED_INPUT=packed,
                           CONTEXT_PARALLEL_STRATEGY=strategy, **overrides)
    if not reordered:  # the model sees the rows in order, the attention assumes the layout
        trainer.token_order = None
    params = trainer.init_state()["params"]
    with jax.set_mesh(trainer.mesh), jax.default_matmul_precision("highest"):
        step = jax.jit(jax.value_and_grad(trainer._loss, has_aux=True))
        (loss, _), grads = step(params, trainer.to_device(batch(packed)), jax.random.key(0))
    return float(loss), jax.tree_util.tree_map(np.asarray, grads)


_REFERENCES = {}


def reference(tmp_path_factory, family: str, packed: bool):
    """loss_and_grads without a context axis (data parallel over 8, praxis's attention)."""
    if (family, packed) not in _REFERENCES:
        _REFERENCES[family, packed] = loss_and_grads(
            tmp_path_factory.mktemp("reference"), family, packed, [1, 8, 1], impl="praxis")
    return _REFERENCES[family, packed]


def assert_equal_to_reference(found, expected):
    (loss, grads), (expected_loss, expected_grads) = found, expected
    assert loss == pytest.approx(expected_loss, rel=RTOL)
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        e = expected_grads
        for key in path:
            e = e[key.key]
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=RTOL * np.max(np.abs(e)),
                                   err_msg=jax.tree_util.keystr(path))


MESHES = {  # [stage, replica, data, context, mdl]
    "cp2-fsdp4": [1, 1, 4, 2, 1],
    "cp4-fsdp2": [1, 1, 2, 4, 1],
    "cp8": [1, 1, 1, 8, 1],
    "cp2-fsdp2-tp2": [1, 1, 2, 2, 2],
    "cp4-tp2": [1, 1, 1, 4, 2],
}
# The kernel per device: flash_attention, the Pallas kernel (interpreted) or XLA's masked
# attention on the gathered keys and values (CONTEXT_PARALLEL_STRATEGY "all_gather"), or
# flash_attention's blocks or the Pallas kernel's around a ring.
KERNELS = {"flash": ("flash", "all_gather"), "pallas": ("pallas", "all_gather"),
           "xla": ("xla", "all_gather"), "ring": ("flash", "ring"),
           "pallas-ring": ("pallas", "ring")}
QUICK = {("gpt", True, "cp2-fsdp4", "flash"), ("gpt", True, "cp4-tp2", "ring"),
         ("llama-gqa", True, "cp4-fsdp2", "pallas")}
CASES = [pytest.param(family, packed, mesh, kernel,
                      marks=[] if (family, packed, mesh, kernel) in QUICK else [pytest.mark.slow],
                      id=f"{family}-{'packed' if packed else 'unpacked'}-{mesh}-{kernel}")
         for family in FAMILIES for packed in (True, False) for mesh in MESHES
         for kernel in (("flash", "pallas", "xla", "ring") if mesh == "cp2-fsdp4"
                        else ("flash", "pallas", "ring", "pallas-ring") if mesh == "cp4-fsdp2"
                        else ("flash", "ring"))]


@pytest.mark.parametrize("family, packed, mesh, kernel", CASES)
def test_losses_and_gradients_equal_the_run_without_a_context_axis(
        tmp_path, tmp_path_factory, family, packed, mesh, kernel):
    impl, strategy = KERNELS[kernel]
    found = loss_and_grads(tmp_path, family, packed, MESHES[mesh], impl=impl, strategy=strategy)
    assert_equal_to_reference(found, reference(tmp_path_factory, family, packed))


def test_the_check_fails_when_the_model_sees_another_order_than_the_attention(
        tmp_path, tmp_path_factory):
    found = loss_and_grads(tmp_path, "gpt", True, MESHES["cp2-fsdp4"], reordered=False)
    with pytest.raises(AssertionError):
        assert_equal_to_reference(found, reference(tmp_path_factory, "gpt", True))


# ----- training and evaluation ---------------------------------------------------------------

RUN = tiny(EVAL_INTERVAL_STEPS=None, EVAL_BATCHES=2, LEARNING_RATE=3e-3, LR_COS_WARMUP=1,
           LR_COS_DECAY_START=1, LR_COS_DECAY_END=100)


@pytest.mark.slow  # two trainers, 4 steps and an evaluation each: about 30 s
def test_training_steps_and_evaluation_equal_the_run_without_a_context_axis(tmp_path):
    def train_and_evaluate(ici):
        trainer = make_trainer(tmp_path / str(ici), ICI_MESH_SHAPE=ici, **RUN)
        with jax.default_matmul_precision("highest"):
            losses, state = run_steps(trainer, 4)
            evaluation = trainer.evaluate(state["params"], 4)
        return losses, evaluation["synthetic_eval"]["loss"]

    losses, eval_loss = train_and_evaluate([1, 1, 2, 4, 1])
    expected_losses, expected_eval_loss = train_and_evaluate([1, 8, 1])
    np.testing.assert_allclose(losses, expected_losses, rtol=RTOL)
    assert eval_loss == pytest.approx(expected_eval_loss, rel=RTOL)


@pytest.mark.slow
def test_per_token_predictions_come_back_in_row_order(tmp_path):
    """The evaluation's per-token outputs (Lambada's predictions file reads them in order)
    are those of the run without a context axis, though the model saw another order."""

    class PerToken:
        name = "per_token"

        @staticmethod
        def batch_outputs(predictions, batch):
            return {"argmax": predictions.per_example_argmax,
                    "xent": predictions.per_token_xent}

    def outputs(ici):
        trainer = make_trainer(tmp_path / str(ici), ICI_MESH_SHAPE=ici, **RUN)
        params = trainer.init_state()["params"]
        with jax.set_mesh(trainer.mesh), jax.default_matmul_precision("highest"):
            found = trainer.eval_step(PerToken)(params, trainer.to_device(batch(True)))
        return jax.tree_util.tree_map(np.asarray, found)

    found, expected = outputs([1, 1, 1, 8, 1]), outputs([1, 8, 1])
    np.testing.assert_array_equal(found["argmax"], expected["argmax"])
    np.testing.assert_allclose(found["xent"], expected["xent"], rtol=RTOL, atol=1e-6)


@pytest.mark.slow  # two trainers of three steps each, per case: 10-20 s
@pytest.mark.parametrize("experiment, overrides, without, with_context", [
    (experiments.BaseExperiment, dict(GRADIENT_ACCUMULATION_STEPS=2, PERCORE_BATCH_SIZE=2),
     [1, 8, 1], [1, 1, 2, 4, 1]),
    (MixtralTiny, dict(NUM_EXPERTS=8, MOE_HIDDEN_DIMS=32, LAMBADA_EVAL=False),
     [1, 8, 1], [1, 1, 4, 2, 1]),  # experts over the 4-way data axis
    (experiments.BaseExperiment, dict(NUM_MICROBATCHES=2), [2, 1, 4, 1], [2, 1, 2, 2, 1]),
], ids=["accumulation", "dropless-experts", "pipeline-stages"])
def test_a_context_axis_composes_with(tmp_path, experiment, overrides, without, with_context):
    def losses(ici):
        trainer = make_trainer(tmp_path / str(ici), experiment=experiment, ICI_MESH_SHAPE=ici,
                               **{**RUN, **overrides})
        with jax.default_matmul_precision("highest"):
            return run_steps(trainer, 3)[0]

    np.testing.assert_allclose(losses(with_context), losses(without), rtol=RTOL)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return isolated_env(8, compilation_cache=str(tmp_path_factory.mktemp("jax_cache")))


CONTEXT_MESH = dict(ICI_MESH_SHAPE=[1, 1, 2, 4, 1])


@pytest.mark.process
@pytest.mark.slow  # about 25 s; tests/test_checkpoints_process.py does the same without it
def test_a_run_with_a_context_axis_killed_after_a_checkpoint_resumes_bitwise(tmp_path, env):
    out, _ = assert_sigkill_then_rerun_matches_an_uninterrupted_run(
        tmp_path, env, *model_flags(VOCAB_SIZE=None), *fdl_flags(**CONTEXT_MESH))
    assert "context" in out


@pytest.mark.process
@pytest.mark.slow
def test_a_checkpoint_with_a_context_axis_restores_onto_a_mesh_without_one(tmp_path, env):
    job = tmp_path / "job"
    flags = fdl_flags(**tiny(**CONTEXT_MESH, MAX_STEPS=2, CHECKPOINT_EVERY_N_STEPS=2))
    out = run_main("--fdl_config=experiments.base.BaseExperiment", f"--job_log_dir={job}",
                   *flags, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    saved = checkpoints.job_checkpoint_dir(str(job))
    for ici in ([1, 8, 1], [2, 2, 2]):
        other = make_trainer(tmp_path / str(ici), ICI_MESH_SHAPE=ici)
        restored = checkpoints.restore(saved, None, other.abstract_state)
        assert_bitwise_equal(restored.state, checkpoints.load_numpy(saved)[1])


# ----- what cannot run --------------------------------------------------------------------


@pytest.mark.parametrize("overrides, message", [
    (dict(MAX_SEQ_LEN=60), r"^MAX_SEQ_LEN=60 does not cut into 2 x 4 equal chunks for 4-way "
                           r"context parallelism .* use a multiple of 8, e\.g\. 64$"),
    (dict(ATTENTION_IMPL="praxis"), r"^ATTENTION_IMPL='praxis' cannot attend with 4-way "
                                    r"context parallelism"),
    (dict(ATTENTION_IMPL="cudnn"), r"^ATTENTION_IMPL='cudnn' cannot attend with 4-way"),
    (dict(ATTEN_DROPOUT_PROB=0.1), r"^attention dropout with 4-way context parallelism "
                                   r"\(the mesh's context axis\) is not built"),
    (dict(NUM_EXPERTS=8, MOE_HIDDEN_DIMS=32, CAPACITY_FACTOR=1.25),
     r"^CAPACITY_FACTOR=1.25 with 4-way context parallelism would drop other tokens"),
    (dict(CONTEXT_PARALLEL_STRATEGY="ring", ATTENTION_IMPL="xla"),
     r"^CONTEXT_PARALLEL_STRATEGY='ring' computes each step with a flash kernel"),
])
def test_what_cannot_run_with_a_context_axis_gets_one_line(overrides, message):
    experiment = MixtralTiny if "NUM_EXPERTS" in overrides else experiments.BaseExperiment
    with pytest.raises(UserError, match=message) as info:
        experiment(**tiny(**CONTEXT_MESH, **overrides)).run_config()
    assert "\n" not in str(info.value)


@pytest.mark.process
@pytest.mark.slow  # a main.py start; the same refusal is checked in process above
def test_main_refuses_an_uneven_sequence_split_in_one_line(tmp_path, env):
    out = run_main("--fdl_config=experiments.base.BaseExperiment", f"--job_log_dir={tmp_path}",
                   *fdl_flags(**tiny(ICI_MESH_SHAPE=[1, 1, 1, 8, 1], MAX_SEQ_LEN=24)), env=env)
    assert out.returncode == 2
    assert_one_line(out, "MAX_SEQ_LEN=24 does not cut into 2 x 8 equal chunks")
