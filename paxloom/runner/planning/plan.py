"""Pre-flight plan (`main.py --mode=plan`): will this run fit, and how fast might it go?

The plan compiles the real train step (Trainer.train_step, with the real state and batch
shardings) for the experiment's whole mesh, ICI x DCN, on as many fake CPU devices, with
abstract inputs: nothing is allocated and no data is read, so GPT175B on 256 devices plans
on a laptop. From the compiled program it reads XLA's per-device memory analysis and the
bytes each collective moves per mesh axis (paxloom/runner/planning/hlo_text.py), sets them beside the
analytic sizes of the sharded state, and judges them against a table of GPUs. When the
run does not fit the chosen GPU, it re-plans the cheapest single changes that might.

Two compilers can plan. XLA:GPU (`--plan_compiler=gpu`, the default where `make install`
put the CUDA plugin) compiles the step for the planned GPU without one
(paxloom/runner/planning/gpu_target.py): its memory is the GPU's buffer assignment, 1.00 to 1.10
times what an H100 measured for four configurations (docs/guides/planning.md). XLA:CPU (`cpu`) compiles it for
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

from paxloom.core import mesh_axes, spec
from paxloom.core.batch import BatchLayout
from paxloom.core.errors import UserError
from paxloom.core.target import TargetDevice
from paxloom.runner.cluster import mesh as mesh_lib
from paxloom.runner.cluster import xla_flags
from paxloom.runner.planning import gpu_target, hlo_text, links, step_account
from paxloom.runner.training import throughput

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class DeviceKind:
    name: str
    memory_bytes: int  # total, as nvidia-smi reports it
    peak_flops: float  # dense bf16 FLOP/s (paxloom/runner/training/throughput.py's table)
    gpus_per_node: int  # GPUs sharing one node's NVLink (paxloom/runner/planning/links.py)
    memory_bytes_per_s: float  # HBM bandwidth, the SXM datasheet's

    @property
    def chip(self) -> str:
        """The GPU without its memory ("H200"), as the device names nvidia-smi and jax
        report hold it ("NVIDIA H200")."""
        return self.name.split()[0]


def _kind(key: str, name: str, memory_mib: int, peak_key: str, hbm_tb_s: float) -> DeviceKind:
    return DeviceKind(name, memory_mib * 2**20, throughput.PEAK_FLOPS_BF16[peak_key],
                      links.INTERCONNECTS[key].gpus_per_node, hbm_tb_s * 1e12)


# HBM bandwidth from NVIDIA's datasheets: H100 SXM 3.35 TB/s, H200 SXM 4.8 TB/s, A100 80GB
# SXM 2.039 TB/s, A100 40GB 1.555 TB/s.
DEVICE_KINDS = {
    "h100": _kind("h100", "H100 80GB", 81559, "H100", 3.35),
    "h200": _kind("h200", "H200 141GB", 143771, "H200", 4.8),
    "a100-80gb": _kind("a100-80gb", "A100 80GB", 81920, "A100", 2.039),
    "a100-40gb": _kind("a100-40gb", "A100 40GB", 40960, "A100", 1.555),
}


def device_key(key: str) -> str:
    """The DEVICE_KINDS key `--plan_device=key` names (aliases resolved: gpu_target.ALIASES)."""
    resolved = gpu_target.canonical(key)
    if resolved not in DEVICE_KINDS:
        raise UserError(f"--plan_device={key}: one of {', '.join(DEVICE_KINDS)} "
                        f"(or {', '.join(gpu_target.ALIASES)})")
    return resolved


def target_device(key: str) -> TargetDevice:
    """The GPU `--plan_device=key` names, as the config builder targets it."""
    key = device_key(key)
    return TargetDevice(platform="gpu", kind=DEVICE_KINDS[key].chip,
                        compute_capability=gpu_target.TARGETS[key].compute_capability,
                        planned=True)


# JAX gives XLA this fraction of each GPU's memory; scripts_gpu/common.sh sets 0.85 (JAX's
# own default is 0.75), and XLA_PYTHON_CLIENT_MEM_FRACTION here overrides it as it would there.
DEFAULT_MEM_FRACTION = 0.85

GPU_CAVEATS = """\
- Compiled by XLA:GPU (jax {jax}'s CUDA plugin) for the planned GPU's description, without
  a GPU: XLA's own fusions, buffer assignment and collectives, but no autotuning (default
  GEMM and fusion configurations), and cuDNN or Pallas attention traced as a plain-JAX
  flash kernel (no [T, T] scores); cuDNN's packed layout adds its own buffers, sized by
  MAX_SEGMENTS_PER_SEQ, as a bound measured on an H200 (layers/attention.py
  cudnn_buffer_bytes). Against four runs measured
  on an H100 (jax 0.11.2), the plan was 1.00 to 1.10 times the real peak (docs/guides/planning.md,
  "Checked against an H100"); the cuDNN runs planned high.
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
    the fastest a GPU has measured, layers/gpu_measurements.json: cuDNN for bf16 on an
    H100 or H200). cuDNN and Pallas are traced as a plain-JAX flash kernel (no [T, T]
    scores), plus cuDNN's packed buffers as a measured bound.
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
- The step time is the calibrated estimate's (paxloom/runner/planning/step_time.py: each
  term printed, its constants fitted on one H200's runs), or with --plan_mfu FLOPs /
  (devices x peak x that MFU), divided by 1 - the bubble for a pipelined run. Neither
  counts the input pipeline, gaps between kernels, stragglers or checkpoints."""


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
    # What the GPU's attention kernel holds beyond the stand-in traced in its place
    # (attention_kernel_bytes); 0 where the traced program is the one that runs.
    kernel_buffers: int = 0

    @property
    def peak(self) -> int:
        """Everything the step holds at once: inputs, outputs not written over donated
        inputs, the temporaries' high-water mark and the attention kernel's own buffers."""
        return (self.arguments + self.outputs - self.aliased + self.temporaries
                + self.kernel_buffers)

    @property
    def activations(self) -> int:
        """What a pass keeps for its backward pass, about: the temporaries less the
        gradients (the rest of them: transient buffers at the high-water mark)."""
        return max(0, self.temporaries - self.gradients)

    @property
    def analytic_floor(self) -> int:
        """No step holds less: its state, one gradient per parameter and its batch."""
        return self.state + self.gradients + self.batch


@dataclasses.dataclass(frozen=True)
class Plan:
    experiment: str  # the launcher's label
    hyperparameters: dict  # the launcher's, for its report and re-plans; never read here
    mesh_shape: dict[str, int]
    ici: list[int]  # ICI_MESH_SHAPE over the mesh's five axes
    dcn: list[int]
    num_devices: int
    batch: BatchLayout
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
    num_layers: int = 0
    pipeline: spec.PipelineSpec | None = None  # None: one stage
    # Per device per step, the FLOPs of the compiled program's matmuls (hlo_text.dot_flops),
    # and of those the ones that recompute the forward pass; 0.0 where not read.
    dot_flops: float = 0.0
    recomputed_flops: float = 0.0
    # The fused attention kernel the program holds a plain-JAX stand-in of (cuDNN, Pallas),
    # with its work per step (the step account's attention); None where the kernel is traced.
    fused_attention: step_account.FusedAttention | None = None

    def portable(self) -> "Plan":
        """This plan without the jax Compiled object (which does not pickle): what crosses
        processes and goes into a cache. Everything read from the program stays."""
        return dataclasses.replace(self, compiled=None)

    @property
    def compiler_name(self) -> str:
        return "XLA:GPU" if self.compiler == "gpu" else "XLA:CPU"

    @property
    def global_batch(self) -> int:
        return self.batch.global_batch

    @property
    def accumulation_steps(self) -> int:
        return self.batch.accumulation_steps

    @property
    def sub_batch(self) -> int:
        """Sequences of one pass through the model: the global batch / accumulation steps."""
        return self.batch.sub_batch

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def tokens_per_pass(self) -> float:
        """The rows of each device's matmuls at a time: its share of a sub-batch's tokens,
        of one microbatch's when pipelined (each stage holds one at a time)."""
        stages = self.mesh_shape.get("stage", 1)
        rows = (self.batch.microbatch_size or self.sub_batch) * stages / self.batch.batch_shards
        return rows * self.seq_len / self.mesh_shape.get("context", 1)

    @property
    def bubble(self) -> float:
        """The share of each pipeline stage's time spent idle; 0 with one stage."""
        return self.pipeline.bubble_fraction() if self.pipeline is not None else 0.0

    @property
    def stage_transfers(self) -> list[hlo_text.Traffic]:
        return hlo_text.stage_transfers(self.traffic)


COMPILERS = ("auto", "gpu", "cpu")


def start(device_count: int, compiler: str = "auto") -> str:
    """Before jax starts: make ready the compiler to plan a mesh of `device_count` devices
    with, and return it: "gpu" (XLA:GPU, when its plugin is installed; `auto` prefers it)
    or "cpu"."""
    if compiler not in COMPILERS:
        raise UserError(f"--plan_compiler={compiler}: one of {', '.join(COMPILERS)}")
    from jax._src import xla_bridge

    started = xla_bridge.backends_are_initialized()  # too late to load a plugin
    if compiler == "cpu" or compiler == "auto" and (started or not gpu_target.installed()):
        use_host_devices(device_count)
        return "cpu"
    if not gpu_target.installed():
        raise UserError(f"--plan_compiler=gpu: XLA:GPU's plugin is not installed (`make "
                        f"install` puts it in {gpu_target.plugin_dir()}); "
                        f"--plan_compiler=cpu plans with XLA:CPU")
    if started:
        raise UserError("--plan_compiler=gpu: jax started before the plan could load "
                        "XLA:GPU's plugin; plan in a fresh process")
    # The XLA flags the GPU launchers set: the plan compiles the program they run.
    xla_flags.use_gpu_defaults()
    gpu_target.start_jax()
    return "gpu"


def use_host_devices(count: int) -> list:
    """`count` CPU devices to plan on. Before jax has started its backends (building a run's
    graph starts them), ask for that many fake ones (or as many as XLA_FLAGS already asks
    for, if more), on the CPU platform even on a GPU machine; after, use what the process
    has."""
    # jax has no public "started yet?"; XLA_FLAGS is read once, when the backend starts.
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        flags = os.environ.get("XLA_FLAGS", "")
        # Never fewer than the process was asked for (a later plan, or tests, may need them).
        asked = [int(n) for n in re.findall(r"--xla_force_host_platform_device_count=(\d+)", flags)]
        flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", flags)
        os.environ["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count="
                                   f"{max([count, *asked])}").strip()
        jax.config.update("jax_platforms", "cpu")
    devices = jax.devices("cpu")
    if len(devices) < count:
        raise UserError(f"the plan needs {count} CPU devices and this process has "
                        f"{len(devices)} (jax started before the plan could ask for more); "
                        f"set the mesh with --fdl.ICI_MESH_SHAPE and --fdl.DCN_MESH_SHAPE, "
                        f"in a fresh process")
    return devices[:count]


def plan(config: fdl.Config, *, compiler: str = "cpu", device: str = "h100",
         device_memory_gb: float = 0.0, experiment: str = "",
         hyperparameters: dict | None = None) -> Plan:
    """Compile the train step of the run graph `config` for its mesh, with XLA:GPU for
    `device` (`compiler="gpu"`, after start()) or on fake CPU devices, and read the result.
    `experiment` and `hyperparameters` are the launcher's labels, carried for its report
    and re-plans; the plan itself reads only the graph."""
    from paxloom.runner.training.trainer import Trainer

    device = device_key(device)
    config = copy.deepcopy(config)
    ici, dcn = list(config.mesh.ici_mesh_shape), list(config.mesh.dcn_mesh_shape)
    if compiler == "gpu":
        memory_bytes = (int(device_memory_gb * 1e9) if device_memory_gb > 0
                        else DEVICE_KINDS[device].memory_bytes)
        devices = gpu_target.devices(device, memory_bytes, ici, dcn)
    else:
        devices = use_host_devices(math.prod(ici) * math.prod(dcn))
    if config.make_train_input is None:
        raise UserError(f"{config.name} is evaluation-only; --mode=plan plans training")
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
        temporaries=analysis.temp_size_in_bytes,
        kernel_buffers=attention_kernel_bytes(config, trainer.batch_layout, run.model_shape,
                                              dict(mesh.shape)))
    program = compiled.as_text()
    traffic = hlo_text.step_traffic(program, dict(mesh.shape), ici, dcn)
    dots = hlo_text.dot_flops(program)
    return Plan(
        experiment=experiment, hyperparameters=dict(hyperparameters or {}),
        mesh_shape=dict(mesh.shape), ici=ici, dcn=dcn,
        num_devices=len(devices), batch=trainer.batch_layout,
        seq_len=run.model_shape.seq_len, num_params=trainer.num_params,
        matmul_params=throughput.matmul_param_count(state["params"],
                                                    run.model_shape.expert_share),
        flops_per_token=trainer.flops_per_token, memory=memory, traffic=traffic,
        upcast_copies=hlo_text.upcast_copies(program) if compiler == "cpu" else [],
        compile_s=compile_s, compiler=compiler, device=device, compiled=compiled,
        num_layers=run.model_shape.num_layers, pipeline=run.pipeline,
        dot_flops=dots.total, recomputed_flops=dots.recomputed,
        fused_attention=fused_attention(config, trainer.batch_layout, run.model_shape,
                                        dict(mesh.shape)))


# What the planner traces its stand-in for (layers/attention.py _fused_kernel_planned).
_STANDING_IN = {"cudnn": "cuDNN flash attention", "pallas": "Pallas flash attention"}


def fused_attention(config: fdl.Config, batch: BatchLayout, shape: spec.ModelShape,
                    mesh_shape: dict[str, int]) -> step_account.FusedAttention | None:
    """Per device, the work of the fused attention kernel a GPU runs where the plan compiles
    the plain-JAX stand-in (cuDNN's or Pallas's): one layer's call on the device's rows and
    heads, and cuDNN's per-segment backward buffers on packed rows."""
    from layers import attention

    template = fused_attention_template(config)
    if template is None or template.attention_impl not in _STANDING_IN:
        return None
    stages = mesh_shape.get("stage", 1)
    rows = max((batch.microbatch_size or batch.sub_batch) * stages // batch.batch_shards, 1)
    seq_len = shape.seq_len // mesh_shape.get(mesh_axes.CONTEXT_AXIS, 1)
    tensor = mesh_shape.get("mdl", 1)
    heads = max(shape.num_heads // tensor, 1)
    kv_heads = max((getattr(template, "num_kv_heads", None) or shape.num_heads) // tensor, 1)
    own = 0
    if template.attention_impl == "cudnn" and template.cudnn_packed:
        own = attention.cudnn_buffer_bytes(rows, seq_len, heads, kv_heads,
                                           shape.dims_per_head, template.max_segments)[1]
    # One call per layer of the device's stage, per sub-batch and pipeline microbatch.
    calls = (shape.num_layers // stages * batch.accumulation_steps
             * (batch.num_microbatches or 1))
    return step_account.FusedAttention(
        _STANDING_IN[template.attention_impl], calls=calls, rows=rows,
        seq_len=seq_len, heads=heads, kv_heads=kv_heads, head_dim=shape.dims_per_head,
        own_buffer_bytes=own)


def attention_kernel_bytes(config: fdl.Config, batch: BatchLayout, shape: spec.ModelShape,
                           mesh_shape: dict[str, int]) -> int:
    """Per device, the bytes cuDNN's packed attention holds beyond the plain-JAX flash
    kernel the plan traces in its place (layers/attention.py cudnn_buffer_bytes): its
    softmax statistics kept by each of the device's layers (an upper bound: as if every
    layer kept them, whatever CHECKPOINT_POLICY recomputes) and one layer's backward
    workspace. 0 for every other kernel, whose traced program is what runs."""
    from layers import attention

    template = fused_attention_template(config)
    if (template is None or template.attention_impl != "cudnn" or not template.cudnn_packed
            or mesh_shape.get(mesh_axes.CONTEXT_AXIS, 1) > 1):
        return 0
    stages = mesh_shape.get("stage", 1)
    rows = (batch.microbatch_size or batch.sub_batch) * stages // batch.batch_shards
    tensor = mesh_shape.get("mdl", 1)
    kv_heads = getattr(template, "num_kv_heads", None) or shape.num_heads
    kept, workspace = attention.cudnn_buffer_bytes(
        max(rows, 1), shape.seq_len, max(shape.num_heads // tensor, 1),
        max(kv_heads // tensor, 1), shape.dims_per_head, template.max_segments)
    return kept * (shape.num_layers // stages) + workspace


def fused_attention_template(config: fdl.Config):
    """The run graph's fused attention layer template (layers/attention.py), or None."""
    from fiddle import daglish

    from layers import attention

    fused = (attention.FusedDotProductAttention, attention.FusedMultiQueryDotProductAttention)
    return next((value for value, _ in daglish.iterate(config.model)
                 if isinstance(value, fdl.Buildable) and value.__fn_or_cls__ in fused), None)


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


def report_lines(p: Plan) -> list[str]:
    """The plan as lines of text: the model, memory per device, collectives, pipeline."""
    shape = p.mesh_shape
    m = p.memory
    unit, scale = ("GiB", GiB) if m.peak >= GiB else ("MiB", 2**20)

    def row(label: str, xla: int | None, analytic: int | None) -> str:
        cells = [f"{v / scale:10.3f}" if v is not None else f"{'-':>10}" for v in (xla, analytic)]
        return f"  {label:<47} {' '.join(cells)}"

    lines = [
        f"Plan: {p.experiment} on {p.num_devices} devices, mesh "
        + " x ".join(f"{k}={v}" for k, v in shape.items())
        + " (ICI {} x DCN {})".format(*mesh_axes.written_shapes(p.ici, p.dcn)),
        f"  global batch {p.global_batch} x {p.seq_len} = {p.tokens_per_step:,} tokens per "
        f"step; PERCORE_BATCH_SIZE={p.batch.percore_batch_size:g}",
    ]
    lines.append(
        f"  compiled by XLA:GPU for {DEVICE_KINDS[p.device].name}, without one "
        f"(paxloom/runner/planning/gpu_target.py)" if p.compiler == "gpu" else
        "  compiled by XLA:CPU on fake CPU devices (--plan_compiler=gpu: XLA:GPU's figures)")
    if p.accumulation_steps > 1:
        lines.append(f"  GRADIENT_ACCUMULATION_STEPS={p.accumulation_steps}: {p.accumulation_steps}"
                     f" sub-batches of {p.sub_batch} sequences, one after another, per update")
    lines += [
        "",
        "Model",
        f"  parameters       {p.num_params:,} ({p.matmul_params:,} in a token's matmuls)",
        f"  FLOPs per token  {p.flops_per_token:.4g} (6N + 12·L·H·Q·T, paxloom/runner/training/throughput.py)",
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
        *([row("+ cuDNN packed attention's own buffers (bound)", None, m.kernel_buffers)]
          if m.kernel_buffers else []),
        row("peak (arguments + outputs - donated + temps)", m.peak, None),
        row("floor (state + gradients + batch)", None, m.analytic_floor),
    ]
    big = [(array, size) for array, size in p.upcast_copies if size >= 0.01 * m.temporaries]
    if big:
        lines.append("  XLA:CPU's float32 copies of bfloat16 arrays (a GPU keeps them in bfloat16; "
                     "sizes, not all live at once):")
        lines += [f"    {array} {format_bytes(size)}" for array, size in big[:5]]
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
                     f"{format_bytes(t.buffer_bytes):>10} {format_bytes(t.sent_bytes):>10}")
    if not p.traffic:
        lines.append("  none (every device computes alone)")
    if p.pipeline is not None:
        lines += ["", *pipeline_lines(p)]
    return lines


def pipeline_lines(p: Plan) -> list[str]:
    """The schedule, its bubble and what the stages send each other."""
    pipe = p.pipeline
    s, m, r = pipe.num_stages, pipe.num_microbatches, pipe.circular_repeat
    blocks = s * r
    layers = p.num_layers // blocks
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
        lines.append(f"  stage-to-stage transfers: {format_bytes(sent)} sent per device per step, over "
                     f"{' and '.join(links)} ({count} collective-permutes along stage: "
                     f"activations forward, their gradients back)")
    else:
        lines.append("  stage-to-stage transfers: none found in the compiled program")
    return lines


def verdict(p: Plan, budget: int) -> str:
    peak, room = p.memory.peak, budget - p.memory.peak
    if room >= 0:
        return f"fits: {format_bytes(peak)} planned, {format_bytes(room)} headroom ({room / budget:.0%})"
    return f"does not fit: {format_bytes(peak)} planned, {format_bytes(-room)} over"


def format_bytes(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
