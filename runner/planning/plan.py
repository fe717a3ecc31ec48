"""Pre-flight plan (`main.py --mode=plan`): will this run fit, and how fast might it go?

The plan compiles the real train step (Trainer.train_step, with the real state and batch
shardings) for the experiment's whole mesh, ICI x DCN, on as many fake CPU devices, with
abstract inputs: nothing is allocated and no data is read, so GPT175B on 256 devices plans
on a laptop. From the compiled program it reads XLA's per-device memory analysis and the
bytes each collective moves per mesh axis (runner/planning/hlo_text.py), sets them beside the
analytic sizes of the sharded state, and judges them against a table of GPUs. When the
run does not fit the chosen GPU, it re-plans the cheapest single changes that might.

Two compilers can plan. XLA:GPU (`--plan_compiler=gpu`, the default where `make install`
put the CUDA plugin) compiles the step for the planned GPU without one
(runner/planning/gpu_target.py): its memory is the GPU's buffer assignment, 0.99 to 1.17
times what an H100 measured for the README's four configurations. XLA:CPU (`cpu`) compiles it for
as many fake CPU devices: the same partitioning, but XLA:CPU's memory (float32 copies of
bfloat16 arrays a GPU does not make: up to 2.7x the GPU's figure). Each plan says which
compiler it used and prints that compiler's caveats.
"""

import copy
import dataclasses
import math
import os
import re
import time

import fiddle as fdl
import jax
import numpy as np
from jax.sharding import Mesh
from praxis import pax_fiddle

from core import spec
from core.errors import UserError
from runner.cluster import mesh as mesh_lib
from runner.planning import gpu_target, hlo_text
from runner.training import throughput

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class DeviceKind:
    name: str
    memory_bytes: int  # total, as nvidia-smi reports it
    peak_flops: float  # dense bf16 FLOP/s (runner/training/throughput.py's table)
    hopper: bool  # compute capability 9.0+: cuDNN's packed attention (layers/attention.py)


DEVICE_KINDS = {
    "h100": DeviceKind("H100 80GB", 81559 * 2**20, throughput.PEAK_FLOPS_BF16["H100"], True),
    "h200": DeviceKind("H200 141GB", 143771 * 2**20, throughput.PEAK_FLOPS_BF16["H200"], True),
    "a100-80gb": DeviceKind("A100 80GB", 81920 * 2**20, throughput.PEAK_FLOPS_BF16["A100"], False),
    "a100-40gb": DeviceKind("A100 40GB", 40960 * 2**20, throughput.PEAK_FLOPS_BF16["A100"], False),
}

# JAX gives XLA this fraction of each GPU's memory; scripts_gpu/common.sh sets 0.85 (JAX's
# own default is 0.75), and XLA_PYTHON_CLIENT_MEM_FRACTION here overrides it as it would there.
DEFAULT_MEM_FRACTION = 0.85

# MFU measured on real hardware, by experiment and device kind key: (MFU, how it was
# measured). From the README's "Measured" table; bench/gpu_bench.py measures more.
MEASURED_MFU: dict[str, dict[str, tuple[float, str]]] = {
    "GPT1_3B": {"h100": (0.524, "PERCORE_BATCH_SIZE=4, ATTENTION_IMPL=cudnn, unpacked rows, "
                                "jax 0.11.2, one GPU")},
}

# Rematerialisation policies from most to least memory (praxis names; "none" = no remat in
# a plain stack, save everything in a repeated one).
REMAT_LADDER = ("none", "save_dot_except_logits_ffn1", "save_dot_with_no_batch_dims",
                "save_qkv_out_proj", "save_nothing")

GPU_CAVEATS = """\
- Compiled by XLA:GPU (jax {jax}'s CUDA plugin) for the planned GPU's description, without
  a GPU: XLA's own fusions, buffer assignment and collectives, but no autotuning (default
  GEMM and fusion configurations), and cuDNN or Pallas attention traced as a plain-JAX
  flash kernel that keeps what they keep (no [T, T] scores). Against four runs measured
  on an H100 (jax 0.11.2), the plan was 0.99 to 1.17 times the real peak (README, "Plan
  before you launch"); the cuDNN runs planned high.
- Not in the figure: what the runtime holds outside the program (the CUDA context, cuBLAS
  and cuDNN workspaces, NCCL's buffers: typically under 1-2 GiB, inside the 15% JAX leaves
  unused at XLA_PYTHON_CLIENT_MEM_FRACTION=0.85).
- The other GPUs' verdicts use this GPU's program; plan for one with --plan_device."""

CPU_CAVEATS = """\
- Compiled by XLA:CPU on fake devices, not by XLA:GPU. The same SPMD partitioner splits the
  same annotated program, so what is sharded, gathered and reduced matches a GPU run; the
  memory figures are XLA:CPU's buffer assignment, and differ from a GPU's:
  * XLA:CPU computes many bfloat16 ops in float32 (matmuls among them) and keeps float32
    copies a GPU would not: for a bfloat16 model, temporaries here can be twice the GPU's or
    more (on this compiler the gradient of a bfloat16 two-matmul function needs 176 MiB of
    temporaries, the same function in float32 80 MiB). The memory table lists the largest
    such copies.
  * XLA:GPU fuses differently, reserves cuBLAS/cuDNN workspace and NCCL buffers, and its
    latency-hiding scheduler overlaps collectives with compute, which keeps more alive.
  * The attention kernel is the one ATTENTION_IMPL resolves to on the planned GPU ("auto":
    cuDNN for bf16 on an H100 or H200; Pallas for float32, or packed rows on an A100).
    Both are traced as a plain-JAX flash kernel that keeps what they keep (no [T, T]
    scores).
  Against four runs measured on an H100 such plans were 2.0 to 2.7 times the real peak,
  so a plan within about 3x of the budget is a question for XLA:GPU (--plan_compiler=gpu).
- XLA:CPU runs bfloat16 collectives in float32 (its float normalization; right after
  partitioning, a bfloat16 model's weight gathers and gradient reductions are bfloat16), so
  for such a model the collective bytes shown are about twice a GPU's. It also leaves FSDP
  gradient reductions as all-reduce; XLA:GPU turns an all-reduce that each device then
  slices into a reduce-scatter, which sends half the bytes."""

COMMON_CAVEATS = """\
- Bytes sent assume ring algorithms (all-reduce 2(n-1)/n of the buffer, all-gather and
  reduce-scatter (n-1)/n); NCCL may pick trees or NVLS, with other constants.
- The step time is FLOPs / (devices x peak x the stated MFU), divided by 1 - the bubble
  for a pipelined run; it ignores communication."""


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes per device. XLA's figures (arguments .. temporaries) come from the compiled
    program; params .. batch are the analytic sizes of the sharded arrays."""

    params: int
    opt_state: int
    state: int  # params, opt_state and the step counter
    gradients: int
    batch: int
    arguments: int
    outputs: int
    aliased: int
    temporaries: int

    @property
    def peak(self) -> int:
        """Everything the step holds at once: inputs, outputs not written over donated
        inputs, and the temporaries' high-water mark."""
        return self.arguments + self.outputs - self.aliased + self.temporaries

    @property
    def analytic_floor(self) -> int:
        """No step holds less: its state, one gradient per parameter and its batch."""
        return self.state + self.gradients + self.batch


@dataclasses.dataclass(frozen=True)
class Plan:
    experiment: str
    hyperparameters: dict
    mesh_shape: dict[str, int]
    num_devices: int
    global_batch: int
    seq_len: int
    num_params: int
    matmul_params: int
    flops_per_token: float
    memory: Memory
    traffic: list[hlo_text.Traffic]
    upcast_copies: list[tuple[str, int]]  # XLA:CPU's float32 copies of bfloat16 arrays
    compile_s: float
    compiler: str  # "gpu" (XLA:GPU for `device`'s description) or "cpu" (XLA:CPU)
    device: str  # the DEVICE_KINDS key compiled for (XLA:GPU) or planned for
    compiled: object = dataclasses.field(repr=False)  # the jax Compiled step (HLO, analyses)
    pipeline: spec.PipelineSpec | None = None  # None: one stage
    accumulation_steps: int = 1  # GRADIENT_ACCUMULATION_STEPS: sub-batches per update

    @property
    def compiler_name(self) -> str:
        return "XLA:GPU" if self.compiler == "gpu" else "XLA:CPU"

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def sub_batch(self) -> int:
        """Sequences of one pass through the model: the global batch / accumulation steps."""
        return self.global_batch // self.accumulation_steps

    @property
    def bubble(self) -> float:
        """The share of each pipeline stage's time spent idle; 0 with one stage."""
        return self.pipeline.bubble_fraction() if self.pipeline is not None else 0.0

    @property
    def stage_transfers(self) -> list[hlo_text.Traffic]:
        return hlo_text.stage_transfers(self.traffic)


def device_count(exp) -> int:
    return math.prod(exp.ICI_MESH_SHAPE) * math.prod(exp.DCN_MESH_SHAPE)


COMPILERS = ("auto", "gpu", "cpu")


def start(exp, compiler: str = "auto") -> str:
    """Before jax starts: make ready the compiler to plan `exp` with, and return it: "gpu"
    (XLA:GPU, when its plugin is installed; `auto` prefers it) or "cpu"."""
    if compiler not in COMPILERS:
        raise UserError(f"--plan_compiler={compiler}: one of {', '.join(COMPILERS)}")
    from jax._src import xla_bridge

    started = xla_bridge.backends_are_initialized()  # too late to load a plugin
    if compiler == "cpu" or compiler == "auto" and (started or not gpu_target.installed()):
        use_host_devices(device_count(exp))
        return "cpu"
    if not gpu_target.installed():
        raise UserError(f"--plan_compiler=gpu: XLA:GPU's plugin is not installed (`make "
                        f"install` puts it in {gpu_target.plugin_dir()}); "
                        f"--plan_compiler=cpu plans with XLA:CPU")
    if started:
        raise UserError("--plan_compiler=gpu: jax started before the plan could load "
                        "XLA:GPU's plugin; plan in a fresh process")
    gpu_target.start_jax()
    return "gpu"


def use_host_devices(count: int) -> list:
    """`count` CPU devices to plan on. Before jax has started its backends (building a run's
    graph starts them), ask for exactly that many fake ones, on the CPU platform even on a
    GPU machine; after, use what the process has."""
    # jax has no public "started yet?"; XLA_FLAGS is read once, when the backend starts.
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                       os.environ.get("XLA_FLAGS", ""))
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
        jax.config.update("jax_platforms", "cpu")
    devices = jax.devices("cpu")
    if len(devices) < count:
        raise UserError(f"the plan needs {count} CPU devices and this process has "
                        f"{len(devices)} (jax started before the plan could ask for more); "
                        f"set the mesh with --fdl.ICI_MESH_SHAPE and --fdl.DCN_MESH_SHAPE, "
                        f"in a fresh process")
    return devices[:count]


def plan(exp, config: fdl.Config, *, compiler: str = "cpu", device: str = "h100",
         device_memory_gb: float = 0.0) -> Plan:
    """Compile the train step of `exp`'s run graph `config` for its mesh, with XLA:GPU for
    `device` (`compiler="gpu"`, after start()) or on fake CPU devices, and read the result."""
    from runner.training.trainer import Trainer

    config = copy.deepcopy(config)
    ici, dcn = list(config.mesh.ici_mesh_shape), list(config.mesh.dcn_mesh_shape)
    if compiler == "gpu":
        memory_bytes = (int(device_memory_gb * 1e9) if device_memory_gb > 0
                        else DEVICE_KINDS[device].memory_bytes)
        devices = gpu_target.devices(device, memory_bytes, ici, dcn)
    else:
        devices = use_host_devices(math.prod(ici) * math.prod(dcn))
    if config.make_train_input is None:
        raise UserError(f"{type(exp).__name__} is evaluation-only; --mode=plan plans training")
    # The step never sees the inputs or the tokenizer: leave them out, so planning needs no
    # data (and no vocabulary) on disk.
    config.make_train_input = None
    config.evals = []
    config.tokenizer = None
    run = pax_fiddle.build(config)
    # One process holds every device, so lay the mesh out directly (create_mesh would
    # insist that DCN_MESH_SHAPE match the process count). Positions along each axis are
    # dcn_index * ICI + ici_index, as jax's hybrid mesh makes them.
    mesh = Mesh(np.asarray(devices).reshape(spec.mesh_size(run.mesh)),
                mesh_lib.MESH_AXIS_NAMES)
    trainer = Trainer(run, mesh, job_log_dir="")
    batch = {k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=trainer.data_sharding)
             for k, s in trainer.batch_shapes.items()}
    start = time.perf_counter()
    with jax.set_mesh(mesh):  # praxis's activation sharding annotations name the mesh's axes
        lowered = trainer.train_step.lower(trainer.abstract_state, batch)
    try:
        compiled = lowered.compile()
    except Exception as error:  # XLA's message is many lines; its first says what failed
        if compiler != "gpu":
            raise
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"XLA:GPU could not compile the train step for {device} ({first}); "
                        f"--plan_compiler=cpu plans with XLA:CPU") from None
    compile_s = time.perf_counter() - start
    analysis = compiled.memory_analysis()
    state = trainer.abstract_state
    params = _device_bytes(state["params"])
    memory = Memory(
        params=params, opt_state=_device_bytes(state["opt_state"]),
        state=_device_bytes(state), gradients=params,
        batch=_device_bytes(batch), arguments=analysis.argument_size_in_bytes,
        outputs=analysis.output_size_in_bytes, aliased=analysis.alias_size_in_bytes,
        temporaries=analysis.temp_size_in_bytes)
    program = compiled.as_text()
    traffic = hlo_text.step_traffic(program, dict(mesh.shape), ici, dcn)
    return Plan(
        experiment=f"{type(exp).__module__}.{type(exp).__name__}",
        hyperparameters=exp.hyperparameters(), mesh_shape=dict(mesh.shape),
        num_devices=len(devices), global_batch=trainer.global_batch_size,
        seq_len=run.model_shape.seq_len, num_params=trainer.num_params,
        matmul_params=throughput.matmul_param_count(state["params"]),
        flops_per_token=trainer.flops_per_token, memory=memory, traffic=traffic,
        upcast_copies=hlo_text.upcast_copies(program) if compiler == "cpu" else [],
        compile_s=compile_s, compiler=compiler, device=device, compiled=compiled,
        pipeline=run.pipeline,
        accumulation_steps=run.loop.gradient_accumulation_steps)


def _device_bytes(tree) -> int:
    """Bytes one device holds of the arrays in `tree` (abstract, with shardings)."""
    return sum(math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize
               for a in jax.tree_util.tree_leaves(tree))


def memory_fraction() -> float:
    return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", DEFAULT_MEM_FRACTION))


def memory_budget(device: DeviceKind, memory_gb: float = 0.0) -> int:
    """Bytes XLA may use on `device` (or on `memory_gb` GB, when given)."""
    total = memory_gb * 1e9 if memory_gb > 0 else device.memory_bytes
    return int(total * memory_fraction())


def fits(p: Plan, budget: int) -> bool:
    return p.memory.peak <= budget


@dataclasses.dataclass(frozen=True)
class Change:
    """One change of hyperparameters and its re-plan (or why it could not be planned)."""

    overrides: dict
    cost: str
    plan: Plan | None = None
    error: str | None = None

    @property
    def flags(self) -> str:
        return " ".join(f"--fdl.{k}={_literal(v)}" for k, v in self.overrides.items())


def _literal(value) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).replace(" ", "")


def candidate_changes(p: Plan) -> dict[str, list[tuple[dict, str]]]:
    """Per kind of change, single changes from the cheapest to the dearest."""
    hp = p.hyperparameters
    policy = hp["CHECKPOINT_POLICY"]
    later = (REMAT_LADDER[REMAT_LADDER.index(policy) + 1:] if policy in REMAT_LADDER
             else ("save_nothing",) if policy != "save_nothing" else ())
    remat = [({"CHECKPOINT_POLICY": name}, "recomputes more of the forward pass in the "
              "backward pass (up to one more forward: about 1/3 more FLOPs)") for name in later]
    # Each sub-batch (GRADIENT_ACCUMULATION_STEPS) splits over the batch shards.
    shards = math.prod(p.mesh_shape.get(a, 1) for a in mesh_lib.BATCH_AXES)
    steps = p.accumulation_steps
    batch, size = [], hp["PERCORE_BATCH_SIZE"]
    while True:
        size /= 2
        exact = size * p.num_devices
        if exact < shards * steps or exact != int(exact) or int(exact) % (shards * steps):
            break
        batch.append(({"PERCORE_BATCH_SIZE": int(size) if size == int(size) else size},
                      f"{size * p.num_devices:g} sequences per step instead of "
                      f"{p.global_batch}: a different optimisation (re-tune the learning "
                      f"rate) and less work per device to hide communication behind"))
    accumulate = []
    while p.global_batch % (shards * steps * 2) == 0:
        steps *= 2
        accumulate.append(({"GRADIENT_ACCUMULATION_STEPS": steps},
                           f"the same update (global batch {p.global_batch}) run as {steps} "
                           f"sub-batches of {p.global_batch // steps} one after another: less "
                           f"work per pass to hide communication behind" + (
                               ", and a pipeline fill and drain per sub-batch"
                               if p.pipeline is not None else "")))
    fsdp = []
    # Three-entry shapes are [replica, data, mdl]; four put the stages first, kept as they are.
    *ici_stage, replica, data, mdl = hp["ICI_MESH_SHAPE"]
    *dcn_stage, dcn_replica, dcn_data, dcn_mdl = hp["DCN_MESH_SHAPE"]
    ici = [*ici_stage, replica, data, mdl]
    if replica > 1:  # the replica axis's devices within a node shard the weights instead
        ici = [*ici_stage, 1, replica * data, mdl]
        fsdp.append(({"ICI_MESH_SHAPE": ici}, "weights gathered over NVLink for every "
                     "layer, forward and backward, instead of held whole"))
    if dcn_replica > 1:  # ... and across nodes too
        fsdp.append(({"ICI_MESH_SHAPE": ici,
                      "DCN_MESH_SHAPE": [*dcn_stage, 1, dcn_replica * dcn_data, dcn_mdl]},
                     "weights gathered across nodes (the slow network) for every layer"))
    changes = {"rematerialisation (CHECKPOINT_POLICY)": remat,
               "smaller batch (PERCORE_BATCH_SIZE)": batch,
               "gradient accumulation (GRADIENT_ACCUMULATION_STEPS)": accumulate,
               "more FSDP (mesh)": fsdp}
    if p.pipeline is not None:
        changes["more, smaller microbatches (pipeline)"] = _more_microbatches(p)
    return changes


def _more_microbatches(p: Plan) -> list[tuple[dict, str]]:
    """NUM_MICROBATCHES doubled (or MICROBATCH_SIZE halved) while the microbatches still
    split over each stage's replica x data shards: less alive per pipeline iteration, and a
    smaller bubble."""
    hp, pipe = p.hyperparameters, p.pipeline
    shards = p.mesh_shape.get("replica", 1) * p.mesh_shape.get("data", 1)
    found, count = [], pipe.num_microbatches
    while p.sub_batch % (count * 2) == 0 and (p.sub_batch // (count * 2)) % shards == 0:
        count *= 2
        bubble = dataclasses.replace(pipe, num_microbatches=count).bubble_fraction()
        change = ({"MICROBATCH_SIZE": p.sub_batch // count} if hp.get("MICROBATCH_SIZE")
                  else {"NUM_MICROBATCHES": count})
        found.append((change, f"{count} microbatches of {p.sub_batch // count} per sub-batch: "
                              f"smaller matmuls per pipeline iteration; the bubble shrinks "
                              f"to {bubble:.1%}"))
    return found


def find_changes(exp, p: Plan, budget: int, variant_graph,
                 device_memory_gb: float = 0.0) -> dict[str, list[Change]]:
    """Per kind, the candidates tried in order, up to and including the first that fits;
    `variant_graph(experiment)` is a changed experiment's run graph, as the command line
    would build it (its graph overrides kept)."""
    found = {}
    for kind, candidates in candidate_changes(p).items():
        tried = []
        for changed, cost in candidates:
            try:
                variant = type(exp)(**{**exp.hyperparameters(), **changed})
                change = Change(changed, cost, plan=plan(
                    variant, variant_graph(variant), compiler=p.compiler, device=p.device,
                    device_memory_gb=device_memory_gb))
            except UserError as error:
                change = Change(changed, cost, error=str(error))
            tried.append(change)
            if change.plan is not None and fits(change.plan, budget):
                break
        found[kind] = tried
    return found


def report(exp, config: fdl.Config, variant_graph, *, compiler: str = "cpu",
           device: str = "h100", mfu: float = 0.4, device_memory_gb: float = 0.0) -> str:
    """The plan of `exp`'s run graph `config` as text: what `main.py --mode=plan` prints.
    `variant_graph(experiment)` builds a changed experiment's graph, as the command line
    built `config`, to re-plan the changes that would fit; `compiler` is start()'s."""
    if device not in DEVICE_KINDS:
        raise UserError(f"--plan_device={device}: one of {', '.join(DEVICE_KINDS)}")
    if not 0 < mfu <= 1:
        raise UserError(f"--plan_mfu={mfu}: a fraction in (0, 1], e.g. 0.4")
    began = time.perf_counter()
    p = plan(exp, config, compiler=compiler, device=device, device_memory_gb=device_memory_gb)
    chosen = DEVICE_KINDS[device]
    budget = memory_budget(chosen, device_memory_gb)
    lines = _describe(p)
    compiled_for = f"; the program compiled for {chosen.name}" if compiler == "gpu" else ""
    lines += ["", f"Verdict (XLA may use {memory_fraction():.0%} of a GPU's memory: "
              f"XLA_PYTHON_CLIENT_MEM_FRACTION, as scripts_gpu/common.sh sets it"
              f"{compiled_for})"]
    for key, kind in DEVICE_KINDS.items():
        size = memory_budget(kind, device_memory_gb if key == device else 0.0)
        name = kind.name + (f" (given {device_memory_gb:g} GB)"
                            if key == device and device_memory_gb > 0 else "")
        lines.append(f"  {name:<26} {_size(size):>9} usable  {_verdict(p, size)}")
    if not fits(p, budget):
        lines += ["", f"Single changes that would fit {chosen.name}, each re-planned:"]
        for kind, tried in find_changes(exp, p, budget, variant_graph,
                                        device_memory_gb).items():
            lines += _describe_changes(kind, tried, budget)
    step_s = p.flops_per_token * p.tokens_per_step / (p.num_devices * chosen.peak_flops * mfu)
    # A pipeline's stages compute at that MFU while busy, and wait out the bubble.
    step_s /= 1 - p.bubble
    bubble = (f", the pipeline bubble ({p.bubble:.1%} idle) included" if p.pipeline is not None
              else "")
    measured = MEASURED_MFU.get(type(exp).__name__, {}).get(device)
    lines += ["", f"Speed on {p.num_devices} x {chosen.name} at an assumed MFU of {mfu:.0%} "
              f"(--plan_mfu)",
              f"  step time {step_s:.3g} s, {p.tokens_per_step / step_s:,.0f} tokens/s, "
              f"{p.tokens_per_step / step_s / p.num_devices:,.0f} tokens/s per device{bubble}",
              f"  measured MFU on {chosen.name}: " + (
                  f"{measured[0]:.1%} ({measured[1]})" if measured is not None else
                  f"none recorded for {type(exp).__name__} yet (bench/gpu_bench.py "
                  f"measures it)")]
    caveats = (GPU_CAVEATS.format(jax=jax.__version__) if compiler == "gpu"
               else CPU_CAVEATS)
    lines += ["", f"Caveats ({p.compiler_name})", caveats, COMMON_CAVEATS, "",
              f"planned in {time.perf_counter() - began:.1f}s "
              f"(train step compiled by {p.compiler_name} in {p.compile_s:.1f}s)"]
    return "\n".join(lines)


def _describe(p: Plan) -> list[str]:
    hp, shape = p.hyperparameters, p.mesh_shape
    m = p.memory
    unit, scale = ("GiB", GiB) if m.peak >= GiB else ("MiB", 2**20)

    def row(label: str, xla: int | None, analytic: int | None) -> str:
        cells = [f"{v / scale:10.3f}" if v is not None else f"{'-':>10}" for v in (xla, analytic)]
        return f"  {label:<47} {' '.join(cells)}"

    lines = [
        f"Plan: {p.experiment} on {p.num_devices} devices, mesh "
        + " x ".join(f"{k}={v}" for k, v in shape.items())
        + f" (ICI {hp['ICI_MESH_SHAPE']} x DCN {hp['DCN_MESH_SHAPE']})",
        f"  global batch {p.global_batch} x {p.seq_len} = {p.tokens_per_step:,} tokens per "
        f"step; PERCORE_BATCH_SIZE={hp['PERCORE_BATCH_SIZE']:g}, "
        f"CHECKPOINT_POLICY={hp['CHECKPOINT_POLICY']}, FPROP_DTYPE={hp['FPROP_DTYPE']}",
    ]
    lines.append(
        f"  compiled by XLA:GPU for {DEVICE_KINDS[p.device].name}, without one "
        f"(runner/planning/gpu_target.py)" if p.compiler == "gpu" else
        "  compiled by XLA:CPU on fake CPU devices (--plan_compiler=gpu: XLA:GPU's figures)")
    if p.accumulation_steps > 1:
        lines.append(f"  GRADIENT_ACCUMULATION_STEPS={p.accumulation_steps}: {p.accumulation_steps}"
                     f" sub-batches of {p.sub_batch} sequences, one after another, per update")
    lines += [
        "",
        "Model",
        f"  parameters       {p.num_params:,} ({p.matmul_params:,} in matmuls)",
        f"  FLOPs per token  {p.flops_per_token:.4g} (6N + 12·L·H·Q·T, runner/training/throughput.py)",
        f"  FLOPs per step   {p.flops_per_token * p.tokens_per_step:.4g}",
        "",
        f"{f'Memory per device ({unit})':<49} {p.compiler_name:>10} {'analytic':>10}",
        row("parameters (float32)", None, m.params),
        row("optimizer state (Adam moments)", None, m.opt_state),
        row("gradients (float32, in temporaries)", None, m.gradients),
        row("batch", None, m.batch),
        row("arguments (state + batch)", m.arguments, m.state + m.batch),
        row("outputs (new state + metrics)", m.outputs, None),
        row("  of which written over donated arguments", m.aliased, None),
        row("temporaries (activations, gradients, ...)", m.temporaries, None),
        row("peak (arguments + outputs - donated + temps)", m.peak, None),
        row("floor (state + gradients + batch)", None, m.analytic_floor),
    ]
    big = [(array, size) for array, size in p.upcast_copies if size >= 0.01 * m.temporaries]
    if big:
        lines.append("  XLA:CPU's float32 copies of bfloat16 arrays (a GPU keeps them in bfloat16; "
                     "sizes, not all live at once):")
        lines += [f"    {array} {_size(size)}" for array, size in big[:5]]
    lines += [
        "",
        "Collectives per step, per device (ring estimates; buffer = the whole gathered or "
        "unreduced array)",
        f"  {'op':<19} {'mesh axes':<18} {'links':<8} {'devices':>7} {'count':>6} "
        f"{'buffer':>10} {'sent':>10}",
    ]
    for t in p.traffic:
        axes = "+".join(t.axes) or "(unread)"
        lines.append(f"  {t.op:<19} {axes:<18} {t.links:<8} {t.group_size:>7} {t.count:>6} "
                     f"{_size(t.buffer_bytes):>10} {_size(t.sent_bytes):>10}")
    if not p.traffic:
        lines.append("  none (every device computes alone)")
    if p.pipeline is not None:
        lines += ["", *_describe_pipeline(p)]
    return lines


def _describe_pipeline(p: Plan) -> list[str]:
    """The schedule, its bubble and what the stages send each other."""
    pipe = p.pipeline
    s, m, r = pipe.num_stages, pipe.num_microbatches, pipe.circular_repeat
    blocks = s * r
    layers = p.hyperparameters["NUM_LAYERS"] // blocks
    layers = f"{layers} layer{'s' if layers > 1 else ''}"
    if r > 1:
        schedule = (f"circular (CIRCULAR_REPEAT={r}: each stage holds {r} blocks of {layers}, "
                    f"visited in turn)")
        formula = f"(S-1)/(R*M+S-1) = {s - 1}/({r}*{m}+{s - 1})"
    else:
        schedule = f"GPipe ({layers} per stage)"
        formula = f"(S-1)/(M+S-1) = {s - 1}/({m}+{s - 1})"
    sent = sum(t.sent_bytes for t in p.stage_transfers)
    count = sum(t.count for t in p.stage_transfers)
    links = sorted({t.links for t in p.stage_transfers})
    per_sub = (f" per sub-batch ({p.accumulation_steps} sub-batches per step)"
               if p.accumulation_steps > 1 else "")
    lines = [
        f"Pipeline: {s} stages, schedule {schedule}",
        f"  {m} microbatches of {p.sub_batch // m} sequence"
        f"{'s' if p.sub_batch // m > 1 else ''}{per_sub}",
        f"  bubble {formula} = {pipe.bubble_fraction():.1%} of each stage's time idle",
    ]
    if p.stage_transfers:
        lines.append(f"  stage-to-stage transfers: {_size(sent)} sent per device per step, over "
                     f"{' and '.join(links)} ({count} collective-permutes along stage: "
                     f"activations forward, their gradients back)")
    else:
        lines.append("  stage-to-stage transfers: none found in the compiled program")
    return lines


def _describe_changes(kind: str, tried: list[Change], budget: int) -> list[str]:
    if not tried:
        return [f"  {kind}: none to try"]
    lines = [f"  {kind}:"]
    for change in tried:
        if change.error:
            lines.append(f"    {change.flags}: cannot plan: {change.error}")
            continue
        bubble = (f"; bubble {change.plan.bubble:.1%}" if change.plan.pipeline is not None
                  else "")
        lines.append(f"    {change.flags}: {_verdict(change.plan, budget)}{bubble}")
        if fits(change.plan, budget):
            lines.append(f"      cost: {change.cost}")
    if all(c.plan is None or not fits(c.plan, budget) for c in tried):
        lines.append("    (none of these fits alone)")
    return lines


def _verdict(p: Plan, budget: int) -> str:
    peak, room = p.memory.peak, budget - p.memory.peak
    if room >= 0:
        return f"fits: {_size(peak)} planned, {_size(room)} headroom ({room / budget:.0%})"
    return f"does not fit: {_size(peak)} planned, {_size(-room)} over"


def _size(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
