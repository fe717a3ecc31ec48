"""USE_FP8 (layers/fp8.py): FP8 training learns like bfloat16, the lowered step really runs
float8 dot-generals, the scaling state is checkpointed, resumed and resharded exactly,
checkpoints cross between FP8 and bfloat16 runs both ways, export and decode read an FP8
run, gradient accumulation and LoRA combine with it, and bad input is refused.

On CPU the FP8 numerics are emulated: the operands are rounded to float8 as on a GPU, and
XLA:CPU multiplies them in a wider type. Nothing here needs a GPU.
"""

import contextlib
import io
import re
import types

import jax
import numpy as np
import pytest
from praxis import pax_fiddle
from safetensors.numpy import load_file

import experiments
from experiments.llama import LlamaBase
from layers import fp8, lora
from paxloom.core.errors import UserError
from paxloom.launch import decode as launch_decode
from paxloom.launch import job
from paxloom.runner.inference import decode
from paxloom.runner.planning import plan as planning
from paxloom.runner.state import checkpoints, initial_weights
from paxloom.tools import export_hf
from tests.support.inference import save_job, save_state
from tests.support.tiny import TINY
from tests.support.training import make_trainer

pytestmark = pytest.mark.usefixtures("compilation_cache")

# bfloat16 compute (FP8 quantizes from it), 8 devices as FSDP x tensor parallelism, a
# learning rate at which the tiny model learns within 50 steps.
RUN = dict(TINY, FPROP_DTYPE="bfloat16", ICI_MESH_SHAPE=[1, 4, 2], PERCORE_BATCH_SIZE=2,
           LEARNING_RATE=3e-3, LR_COS_WARMUP=5)
FAMILIES = {"gpt": (experiments.BaseExperiment, {}),
            "llama_gqa": (LlamaBase, dict(NUM_KV_HEADS=4))}  # 8 query heads in 4 groups
STEPS = 50
# FP8 einsums per model: per layer, GPT's combined QKV, output, and two feed-forward
# projections; Llama's query, key, value, output, and three (gated) feed-forward ones.
EINSUMS = {"gpt": 2 * 4, "llama_gqa": 2 * 7}
SCALING_STATE = re.compile(fp8.SCALING_STATE_RULE)


def flat(tree) -> dict:
    return {checkpoints.param_path(p): np.asarray(leaf)
            for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def scaling_state(params) -> dict:
    return {k: v for k, v in flat(params).items() if SCALING_STATE.match(k)}


def num_fp8_einsums(params) -> int:
    names = scaling_state(params)
    assert len(names) % 6 == 0
    return len(names) // 6


def train(trainer, steps: int, state=None):
    """(per-step losses, the scaling state after the first step, final state)."""
    state = trainer.init_state() if state is None else state
    data = trainer.make_train_input()
    losses, first = [], None
    for _ in range(steps):
        with jax.set_mesh(trainer.mesh):
            state, metrics = trainer.train_step(state, trainer.to_device(data.next_batch()))
        losses.append(float(metrics["loss"]))
        if first is None:
            first = scaling_state(jax.device_get(state["params"]))
    return losses, first, state


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """family -> {"bf16"|"fp8": (losses, scaling state after step 1, final state, trainer)}
    of STEPS steps from the same initialisation and data, computed once."""
    done = {}

    def get(family):
        if family not in done:
            experiment, overrides = FAMILIES[family]
            done[family] = {}
            for name, use_fp8 in (("bf16", False), ("fp8", True)):
                trainer = make_trainer(tmp_path_factory.mktemp(f"{family}_{name}"),
                                       experiment=experiment, USE_FP8=use_fp8,
                                       **{**RUN, **overrides})
                with contextlib.redirect_stdout(io.StringIO()):
                    done[family][name] = (*train(trainer, STEPS), trainer)
        return done[family]

    return get


# ----- 1. learning --------------------------------------------------------------------------


# Both with the slow tests (the GPT's took 36 s of the quick loop's 15 minutes).
@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt", "llama_gqa"])
def test_fp8_learns_like_bfloat16(runs, family):
    """After 50 steps the FP8 run's loss is within 2**-4 of bfloat16's learning progress.

    The bound comes from the format, not from a run: float8_e4m3fn (weights and
    activations) has 3 mantissa bits, so rounding to it has a relative error of at most
    2**-4 (half a unit in the last place); the matmul inputs of an FP8 run are bfloat16's
    perturbed by that much, so it may lose at most that fraction of what bfloat16 learnt,
    |loss_fp8 - loss_bf16| <= 2**-4 * (loss_bf16[0] - loss_bf16[-1]). (Measured: GPT
    3.0598 bf16 vs 3.0611 FP8, Llama 2.6951 vs 2.7000, from 6.25; bound about 0.2.)
    """
    bf16_losses, _, _, _ = runs(family)["bf16"]
    fp8_losses, first, state, _ = runs(family)["fp8"]
    progress = bf16_losses[0] - bf16_losses[-1]
    print(f"{family} after {STEPS} steps from {bf16_losses[0]:.4f}: bf16 {bf16_losses[-1]:.4f}, "
          f"FP8 {fp8_losses[-1]:.4f}, bound {2**-4 * progress:.3f}")
    assert progress > 2.5  # it learnt: the bound is not vacuous
    assert abs(fp8_losses[-1] - bf16_losses[-1]) <= 2**-4 * progress, (fp8_losses[-1],
                                                                        bf16_losses[-1])
    assert fp8_losses != bf16_losses  # FP8 changed the numerics
    # The delayed scales moved off their initial 1.0 (from the second step on, the first
    # step's amax sets them), and every history recorded amaxes.
    final = scaling_state(jax.device_get(state["params"]))
    assert num_fp8_einsums(state["params"]) == EINSUMS[family]
    for name, value in final.items():
        if name.endswith("_scale"):
            assert value.shape == (1,) and value[0] != 1.0, name
            assert first[name][0] == 1.0, name  # step 1 quantized with the initial scale
        else:
            assert value.shape == (fp8.AMAX_HISTORY_LENGTH,), name
            # flax's ring: the newest at [0], the ones before it at the end.
            recorded = np.concatenate([value[:1], value[1 - STEPS:]])
            assert (recorded > 0).all() and np.count_nonzero(value) == STEPS, name


# ----- 2. the FP8 path is taken ---------------------------------------------------------


def fp8_dot_generals(trainer) -> dict[str, int]:
    """How many dot_generals of the lowered train step take float8 operands: "forward"
    (e4m3 x e4m3) and "backward" (e5m2 output gradient x e4m3)."""
    batch = {k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=trainer.data_sharding)
             for k, s in trainer.batch_shapes.items()}
    with jax.set_mesh(trainer.mesh):
        text = trainer.train_step.lower(trainer.abstract_state, batch).as_text()
    dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    assert dots
    operands = [re.search(r":\s*\((.*)\)\s*->", line).group(1) for line in dots]
    return {"forward": sum(o.count("f8E4M3FN") == 2 for o in operands),
            "backward": sum("f8E5M2" in o and "f8E4M3FN" in o for o in operands),
            "any": sum("f8E" in o for o in operands),
            # amax histories cast to the compute dtype (praxis's theta would do that)
            "bf16_histories": text.count(f"tensor<{fp8.AMAX_HISTORY_LENGTH}xbf16>")}


@pytest.mark.parametrize("family", ["gpt", "llama_gqa"])
def test_the_train_step_runs_float8_dot_generals(tmp_path, family):
    experiment, overrides = FAMILIES[family]
    trainer = make_trainer(tmp_path / "fp8", experiment=experiment, USE_FP8=True,
                           **{**RUN, **overrides})
    n = num_fp8_einsums(trainer.abstract_state["params"])
    assert n == EINSUMS[family]
    counts = fp8_dot_generals(trainer)
    # Each FP8 einsum: one forward dot (rematerialisation recomputes some of them in the
    # backward pass: up to twice) and two backward dots (input and kernel gradients);
    # nothing else in float8.
    assert 0 < n <= counts["forward"] <= 2 * n, counts
    assert counts["backward"] == 2 * n, counts
    assert counts["any"] == counts["forward"] + counts["backward"]
    assert counts["bf16_histories"] == 0  # the scaling state is computed in float32
    bf16 = make_trainer(tmp_path / "bf16", experiment=experiment, **{**RUN, **overrides})
    assert fp8_dot_generals(bf16)["any"] == 0


# ----- 3. checkpoints: resume and reshard ---------------------------------------------------

JOB = dict(RUN, USE_FP8=True, MAX_STEPS=4, CHECKPOINT_EVERY_N_STEPS=2, SUMMARY_INTERVAL_STEPS=1)


def run_job(job_dir, restore_dir=None, restore_step=None, **overrides):
    exp = experiments.BaseExperiment(**{**JOB, **overrides})
    with contextlib.redirect_stdout(io.StringIO()):
        job.run(exp, job.RunOptions(job_log_dir=str(job_dir), restore_checkpoint_dir=restore_dir,
                                    restore_checkpoint_step=restore_step))


def ckpt_dir(job_dir) -> str:
    return checkpoints.job_checkpoint_dir(str(job_dir))


@pytest.fixture(scope="module")
def fp8_job(tmp_path_factory):
    """An uninterrupted 4-step FP8 job, checkpoints at steps 2 and 4: (its directory, its
    final state as numpy)."""
    job_dir = tmp_path_factory.mktemp("fp8_job")
    run_job(job_dir)
    step, state = checkpoints.load_numpy(ckpt_dir(job_dir))
    assert step == 4
    return job_dir, state


def assert_bitwise_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for name, value in a.items():
        assert value.dtype == b[name].dtype and value.tobytes() == b[name].tobytes(), name


@pytest.mark.process
def test_a_resumed_fp8_run_ends_bitwise_like_an_uninterrupted_one(fp8_job, tmp_path):
    """A fresh job restoring the step-2 checkpoint trains steps 3 and 4 to the same state,
    scaling state and Adam moments included: nothing of FP8 lives outside the checkpoint."""
    job_dir, final = fp8_job
    _, midway = checkpoints.load_numpy(ckpt_dir(job_dir), 2)
    saved = scaling_state(midway["params"])
    assert len(saved) == 6 * 8
    assert any(v[0] != 1.0 for k, v in saved.items() if k.endswith("_scale"))  # not fresh
    run_job(tmp_path, restore_dir=ckpt_dir(job_dir), restore_step=2)
    step, resumed = checkpoints.load_numpy(ckpt_dir(tmp_path))
    assert step == 4
    assert_bitwise_equal(flat(resumed), flat(final))
    # The scaling state went on moving after the restore (steps 3 and 4 wrote their amaxes).
    assert scaling_state(resumed["params"]).keys() == saved.keys()
    assert any(v.tobytes() != saved[k].tobytes()
               for k, v in scaling_state(resumed["params"]).items())


@pytest.mark.process
@pytest.mark.parametrize("ici", [[2, 2, 2], [1, 8, 1]])
def test_restore_onto_another_mesh_gives_the_same_scaling_state(fp8_job, tmp_path, ici):
    job_dir, final = fp8_job
    other = make_trainer(tmp_path, USE_FP8=True, **{**RUN, "ICI_MESH_SHAPE": ici})
    restored = checkpoints.restore(ckpt_dir(job_dir), None, other.abstract_state)
    assert_bitwise_equal(flat(jax.device_get(restored.state)), flat(final))
    assert jax.tree_util.tree_map(lambda a: a.sharding, restored.state) == other.state_shardings


# ----- 4. CHECKPOINT_RESTORE_PATH between bfloat16 and FP8 runs ----------------------------


def start_from(tmp_path, path, **overrides):
    """(fresh parameters, parameters read from `path`) of a new run of RUN + overrides with
    CHECKPOINT_RESTORE_PATH=path, as paxloom/launch/job.py reads them."""
    exp = experiments.BaseExperiment(**{**RUN, **overrides, "CHECKPOINT_RESTORE_PATH": str(path)})
    config = exp.run_config()
    trainer = make_trainer(tmp_path, **{**RUN, **overrides})
    fresh = trainer.init_state()["params"]
    with contextlib.redirect_stdout(io.StringIO()):
        params = initial_weights.load(pax_fiddle.build(config).initial_weights, fresh,
                                      trainer.abstract_state["params"], config.model)
    return flat(jax.device_get(fresh)), flat(jax.device_get(params))


def test_a_bfloat16_checkpoint_starts_an_fp8_run_with_fresh_scaling_state(tmp_path):
    source = tmp_path / "bf16"
    exp = experiments.BaseExperiment(**RUN)
    params, _ = save_job(source, exp)
    saved = flat(jax.device_get(params))
    fresh, loaded = start_from(tmp_path / "target", source, USE_FP8=True)
    assert set(loaded) - set(saved) == set(scaling_state_names(loaded)) != set()
    for name, value in loaded.items():
        if SCALING_STATE.match(name):  # scale 1, empty history
            assert value.tobytes() == fresh[name].tobytes(), name
            assert (value == (0.0 if name.endswith("history") else 1.0)).all(), name
        else:
            assert value.tobytes() == saved[name].tobytes(), name


@pytest.mark.process
def test_an_fp8_checkpoint_starts_a_bfloat16_run_ignoring_its_scaling_state(fp8_job, tmp_path):
    job_dir, final = fp8_job
    saved = flat(final["params"])
    _, loaded = start_from(tmp_path, job_dir)
    assert not scaling_state_names(loaded)
    assert set(saved) - set(loaded) == set(scaling_state_names(saved))
    for name, value in loaded.items():
        assert value.tobytes() == saved[name].tobytes(), name


def scaling_state_names(flat_params: dict) -> list[str]:
    return [k for k in flat_params if SCALING_STATE.match(k)]


# ----- 5. export and decode ----------------------------------------------------------------


@pytest.fixture(scope="module")
def bf16_twin(fp8_job, tmp_path_factory):
    """A bfloat16 run's job directory holding the FP8 job's final weights (its scaling
    state dropped): what export and decode of the FP8 run must equal."""
    _, final = fp8_job
    saved = flat(final["params"])
    job_dir = tmp_path_factory.mktemp("bf16_twin")
    exp = experiments.BaseExperiment(**RUN)
    trainer = make_trainer(job_dir, **RUN)
    abstract = trainer.abstract_state
    state = {"step": np.int32(4),
             "params": jax.tree_util.tree_map_with_path(
                 lambda p, a: saved[checkpoints.param_path(p)], abstract["params"]),
             "opt_state": jax.tree_util.tree_map(lambda a: np.zeros(a.shape, a.dtype),
                                                 abstract["opt_state"])}
    save_state(job_dir, exp, trainer, jax.device_put(state, trainer.state_shardings))
    return job_dir


@pytest.mark.process
def test_export_of_an_fp8_run_is_its_weights_without_scaling_state(fp8_job, bf16_twin,
                                                                   tmp_path):
    with contextlib.redirect_stdout(io.StringIO()):
        got = load_file(export_hf.export(str(fp8_job[0]), str(tmp_path / "fp8"))
                        / "model.safetensors")
        want = load_file(export_hf.export(str(bf16_twin), str(tmp_path / "bf16"))
                         / "model.safetensors")
    assert not [k for k in got if "scale" in k or "amax" in k]
    assert_bitwise_equal(got, want)


@pytest.mark.process
def test_decode_of_an_fp8_run_reads_its_weights(fp8_job, bf16_twin):
    """Decoding runs the cached decoder in the compute dtype (bfloat16) on the checkpoint's
    float32 weights: an FP8 run decodes as the bfloat16 run of the same weights."""
    prompts = ["5 6 7", "100 3 400 17 9 23 250 11"]

    def run(job_dir, **overrides):
        exp = experiments.BaseExperiment(**{**RUN, **overrides})
        options = decode.DecodeOptions(job_log_dir=str(job_dir), prompts=prompts,
                                       max_decode_steps=6)
        with contextlib.redirect_stdout(io.StringIO()):
            return launch_decode.run(exp, exp.run_config(), options)

    got = run(fp8_job[0], USE_FP8=True)
    assert [r["tokens"] for r in got] == [6, 6]
    assert [r["continuation"] for r in got] == [r["continuation"] for r in run(bf16_twin)]


# ----- 6. gradient accumulation and LoRA ---------------------------------------------------

ACCUMULATED_STEPS = 6


@pytest.mark.slow  # about 40 s on 2 cores: the quick loop stays under 15 minutes
def test_accumulated_fp8_steps_take_the_whole_batchs_amax(runs, tmp_path):
    """GRADIENT_ACCUMULATION_STEPS=2 runs the K=1 FP8 run's steps.

    The forward passes quantize with the same scales: the amax histories of inputs and
    kernels take the maximum over the sub-batches, which is the whole batch's amax,
    exactly (a maximum does not round). The backward pass gives each token the gradient a
    single pass gives it (paxloom/runner/training/accumulation.py), so the output gradients' amaxes
    match too, to bfloat16's rounding (2**-7 relative). So the first loss differs only by the
    order of a float32 sum (rtol 1e-6), and later ones by the output gradients' e5m2 rounding
    and summation order: within 2**-8,
    bfloat16's relative rounding unit, the precision to which the bfloat16 compute
    determines a loss at all. (Measured: 8e-4 at most over 10 steps.)
    """
    losses, first, _, _ = runs("gpt")["fp8"]
    trainer = make_trainer(tmp_path, USE_FP8=True, GRADIENT_ACCUMULATION_STEPS=2, **RUN)
    with contextlib.redirect_stdout(io.StringIO()):
        accumulated, accumulated_first, _ = train(trainer, ACCUMULATED_STEPS)
    np.testing.assert_allclose(accumulated[0], losses[0], rtol=1e-6)
    np.testing.assert_allclose(accumulated, losses[:ACCUMULATED_STEPS], rtol=2**-8)
    name = "lm/transformer/x_layers_1/ff_layer/ffn_layer1/linear/einsum/input_amax_history"
    assert accumulated_first[name][0] > 0
    assert accumulated_first[name][0] == first[name][0]
    for name, value in first.items():  # every input and kernel amax and scale
        if "output_grad" not in name:
            assert accumulated_first[name].tobytes() == value.tobytes(), name
        elif name.endswith("amax_history"):  # the same scale, not K x tokens times it
            np.testing.assert_allclose(accumulated_first[name][0], value[0], rtol=2**-7,
                                       err_msg=name)


def test_lora_with_fp8_trains_the_adapters_and_updates_the_scaling_state(tmp_path):
    trainer = make_trainer(tmp_path, USE_FP8=True, USE_LORA=True, LORA_RANK=4, **RUN)
    state = trainer.init_state()
    before = flat(jax.device_get(state["params"]))
    with contextlib.redirect_stdout(io.StringIO()):
        losses, _, state = train(trainer, 3, state)
    after = flat(jax.device_get(state["params"]))
    adapter, scaling = re.compile(lora.ADAPTER_RULE), SCALING_STATE
    changed = {k for k in after if after[k].tobytes() != before[k].tobytes()}
    adapters = {k for k in after if adapter.match(k)}
    assert adapters and changed & adapters  # the adapters train
    assert {k for k in after if scaling.match(k)} <= changed  # every scaling leaf moved
    assert changed <= adapters | {k for k in after if scaling.match(k)}  # the rest is frozen
    assert all(np.isfinite(losses))


# ----- 7. bad input ------------------------------------------------------------------------


def test_fp8_with_pipeline_stages_is_one_line():
    with pytest.raises(UserError, match="USE_FP8 with pipeline stages is not supported") as error:
        experiments.BaseExperiment(**TINY, USE_FP8=True, ICI_MESH_SHAPE=[2, 1, 2, 2],
                                   NUM_MICROBATCHES=2)
    assert "\n" not in str(error.value)


def gpu(capability: str):
    return types.SimpleNamespace(compute_capability=capability, platform="gpu",
                                 device_kind=f"GPU {capability}")


def test_fp8_tensor_cores_from_compute_capability():
    assert not fp8.has_fp8_tensor_cores([gpu("8.0")])
    assert fp8.has_fp8_tensor_cores([gpu("8.9")])
    assert fp8.has_fp8_tensor_cores([gpu("9.0")])
    assert not fp8.has_fp8_tensor_cores([gpu("9.0"), gpu("8.6")])


def test_a_plan_of_fp8_for_an_a100_is_one_line():
    exp = experiments.BaseExperiment(**TINY, USE_FP8=True, ATTENTION_IMPL="xla")
    exp.run_config(target=planning.target_device("h100"))  # an H100 plan
    with pytest.raises(UserError, match=r"USE_FP8=True needs FP8 tensor cores .* the planned "
                                        r"A100 has none: plan with --plan_device=h100") as error:
        exp.run_config(target=planning.target_device("a100-80gb"))
    assert "\n" not in str(error.value)


def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_one_line(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "devices", lambda *_: [gpu("8.0")] * 8)
    exp = experiments.BaseExperiment(**TINY, USE_FP8=True, ATTENTION_IMPL="xla")
    with pytest.raises(UserError, match=r"USE_FP8=True needs FP8 tensor cores .* this GPU 8\.0 "
                       r"has none") as error:
        exp.run_config()
    assert "\n" not in str(error.value)
