"""Training speed per model and attention implementation, on whatever devices are present.

For each experiment (Synthetic126M, GPT1_3B, Synthetic5B cut to 8 layers so it fits one
GPU, and Llama1B, the last three on synthetic data) and each attention implementation
(layers/attention.py: praxis, xla, cudnn, pallas, auto): compile time, steady step time,
tokens/s, MFU (docs/performance.md's formula, against paxloom/runner/training/throughput.py's peak table), peak
device memory and XLA's own estimate of it, as a table on stdout and a JSON file (a list
of rows, each with the device kind and the jax and torch versions), rewritten after each
row so that a run cut off keeps what it measured. --dry_run only builds each row's
experiment and graph (bench/gpu_check.sh --dry-run checks its command lines that way).

The mixture-of-experts rows are chosen by name only (bench/rows.py MOE_CONFIGS): Qwen3A3B_moe
(Qwen3MoE30B_A3B cut to 4 layers), Qwen3A3B_dense (the same with one dense feed-forward of a
token's width, k x MOE_HIDDEN_DIMS), Qwen3A3B_tokamax and Qwen3A3B_padded (the MoE by other
backends) and GLaM126M64E (PileGLaM126M64E, all 64 experts, its
attention praxis's whatever --impls says, which "auto" shows as auto>praxis). Their MFU
counts a token's active parameters (expert weights x k / E), as "active_params" in the JSON.
So are the long-sequence rows (LONG_CONFIGS): Llama8B_64K and Llama8B_128K, Llama31_8B cut
to 4 layers at 65536 and 131072 tokens, one sequence a step (the second with the
'save_nothing' checkpoint policy); a row that does not fit is an error row, and the next
row still runs.

Every row compiles its train step ahead of its first call and compares the compiled step's
memory with what the device can still give (paxloom/runner/training/memory_check.py, as main.py
does): a row that cannot fit is an error row, "the train step needs X GiB ... has Y GiB
free", instead of an out-of-memory error from XLA, and the next row still runs. Each row
also records what a row of the table of GPU-measured paths needs (layers/measured.py:
the implementation "auto" resolved to, packed rows, grouped key/value heads, the compute
dtype, a context axis, a Hopper-or-newer GPU, MAX_SEGMENTS_PER_SEQ, the MoE backend, the
date on this machine, and a command that reruns the row alone);
`python bench/gpu_check_figures.py rows DIR` turns them into table rows. --sweep
NAME=V1,V2 runs each row once per value (e.g. MAX_SEGMENTS_PER_SEQ=8,16).

Every row runs in a fresh child process (`--one CONFIG IMPL`, which prints one JSON line),
so its peak device memory is its own and not the maximum of the rows before it, and an
out-of-memory row cannot disturb the next one. A child times the loop main.py runs
(Trainer.train): batches from the prefetch thread, the state donated, steps dispatched
without waiting for the device (except on CPU, as the Trainer), one wait at the end of the
timed window. A thread beside the loop notes when each step's outputs become ready; the
step time is the median of those intervals.

The rows train on synthetic data, rows of one document each, packed as the experiment
says (PACKED_INPUT; all of them pack); --unpacked sets PACKED_INPUT=False everywhere.
With --torch, a plain PyTorch GPT of the same shape (bench/torch_gpt.py, one device)
runs first for each GPT experiment, and each row shows its tokens/s per device over the
torch peer's. With --tiny (the default on CPU) every model, the torch peer's too, shrinks
to 2 layers x 64, so CI can run the whole path in seconds.

With --fp8, each row is followed by the same row with USE_FP8=True (layers/fp8.py): its
tokens/s over the bfloat16 row's ("vs bf16"), and the loss of both after --loss_steps
training steps (100 unless given; same seed, same synthetic batches). MFU is against the
bfloat16 dense peak in FP8 rows too, so their MFU ratio is the speed-up. On a GPU each row
also counts the cuBLASLt FP8 GEMM calls (`__cublas$lt$matmul$f8`) in its compiled step
("f8 GEMMs"): 0 in an FP8 row means XLA fell back to f16/bf16 GEMMs. bench/fp8_gemm.py
times the raw GEMMs.

    python bench/gpu_bench.py --json runs/gpu_bench.json                  # on the GPUs present
    python bench/gpu_bench.py --configs Synthetic5B,GPT1_3B --impls auto --fp8 \
        --percore_batch_size 4                                            # FP8 vs bf16
    python bench/gpu_bench.py --configs Synthetic126M --impls praxis,pallas,cudnn --steps 20
    python bench/gpu_bench.py --configs Synthetic126M --impls cudnn --sweep MAX_SEGMENTS_PER_SEQ=8,16
    python bench/gpu_bench.py --configs GPT1_3B --torch                   # against PyTorch
    python bench/gpu_bench.py --one Synthetic126M auto --steps 20         # one row, as JSON
    python bench/gpu_bench.py --configs Qwen3A3B_moe,Qwen3A3B_dense,Qwen3A3B_tokamax,Qwen3A3B_padded,GLaM126M64E --impls auto
    python bench/gpu_bench.py --configs Llama8B_64K,Llama8B_128K --impls auto --steps 2 --warmup 1
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/gpu_bench.py --steps 2
"""

import argparse
import ast
import datetime
import importlib.util
import itertools
import json
import os
import queue
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from bench import profile_summary  # noqa: E402
from bench.rows import (  # noqa: E402
    CONFIGS,
    HEADER,
    LONG_CONFIGS,
    MOE_CONFIGS,
    TORCH_CONFIGS,
    experiment,
    format_row,
)

# A child's result is the stdout line that starts with this; anything else it prints
# (the runner's log lines, library warnings) is not parsed.
ROW_PREFIX = "gpu_bench row: "
# A child prints this line, what the row is (describe), before it measures: a row whose
# child is killed (a time limit, a crash in a kernel) still says what it was.
ABOUT_PREFIX = "gpu_bench about: "
GIB = 2**30
FP8_GEMM_CALL = "__cublas$lt$matmul$f8"  # XLA's cuBLASLt FP8 GEMM custom call


# ----- a child: one row -------------------------------------------------------------


class CompletionClock:
    """Notes when each dispatched step's metrics become ready, on a thread of its own, so
    that the loop being timed never waits for the device itself."""

    def __init__(self):
        self.times: list[float] = []
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._watch, name="completion-clock",
                                        daemon=True)
        self._thread.start()

    def add(self, metrics) -> None:
        self._queue.put(metrics)

    def _watch(self) -> None:
        import jax

        while (metrics := self._queue.get()) is not None:
            jax.block_until_ready(metrics)
            self.times.append(time.perf_counter())

    def close(self) -> list[float]:
        self._queue.put(None)
        self._thread.join()
        return self.times


def train_steps(trainer, state, prefetcher, steps: int, clock: CompletionClock | None = None):
    """`steps` iterations of Trainer.train's loop body: the next prefetched batch, the
    donated step dispatched under the mesh, no wait on GPUs (the Trainer waits on CPU,
    see Trainer.__init__, so this does too)."""
    import jax

    metrics = None
    for _ in range(steps):
        batch, _ = next(prefetcher)
        with jax.set_mesh(trainer.mesh):
            state, metrics = trainer.train_step(state, batch)
        if trainer.sync_every_step:
            jax.block_until_ready(metrics)
        if clock is not None:
            clock.add(metrics)
    return state, metrics


def attention_used(config) -> str:
    """The implementation the built graph's attention runs ("auto" resolved)."""
    import fiddle as fdl
    from fiddle import daglish

    for value, _ in daglish.iterate(config.model):
        if isinstance(value, fdl.Buildable) and "attention_impl" in value.__arguments__:
            return value.attention_impl
    return "praxis"


def describe(exp, config) -> dict:
    """What a row of layers/measured.py's table needs to know of this row, known before it
    measures: the attention implementation the graph runs ("auto" resolved), the case
    (layers/measured.py CASE_FIELDS: packed rows, fewer key/value heads than query heads,
    FPROP_DTYPE, a context mesh axis, a GPU of compute capability 9.0 or more),
    MAX_SEGMENTS_PER_SEQ, the MoE layer, the batch, the device, jax and the date here."""
    import jax

    from paxloom.core import mesh_axes, target
    from paxloom.core.mesh_axes import CONTEXT_AXIS

    device = target.this_process()
    kv_heads = getattr(exp, "NUM_KV_HEADS", None) or exp.NUM_HEADS
    experts = getattr(exp, "NUM_EXPERTS", 0) or 0
    moe_backend = None
    if experts:
        from experiments.glam import GLaMBase

        # GLaM's mixtures are praxis's GShard layers, which read no MOE_BACKEND.
        moe_backend = "gshard" if isinstance(exp, GLaMBase) else exp.MOE_BACKEND
    return {
        "resolved": attention_used(config), "packed": exp.PACKED_INPUT,
        "grouped_kv": kv_heads < exp.NUM_HEADS, "fprop_dtype": exp.FPROP_DTYPE,
        "context": mesh_axes.axis_size(exp.ICI_MESH_SHAPE, exp.DCN_MESH_SHAPE,
                                       CONTEXT_AXIS) > 1,
        "hopper": device.hopper_or_newer, "platform": device.platform,
        "compute_capability": ".".join(map(str, device.compute_capability)),
        "max_segments": exp.MAX_SEGMENTS_PER_SEQ, "num_experts": experts,
        "moe_backend": moe_backend,
        # Pax's rule (paxloom/core/batch.py); the measured row overwrites it with the trainer's.
        "global_batch": round(exp.PERCORE_BATCH_SIZE * jax.device_count()),
        "seq_len": exp.MAX_SEQ_LEN, "device": device.kind, "devices": jax.device_count(),
        "jax": jax.__version__, "date": datetime.date.today().isoformat(),
    }


def memory_analysis(compiled) -> dict | None:
    """XLA's memory estimate of the compiled step, per device, or None where the backend
    gives none: arguments + outputs - what the outputs reuse of the (donated) arguments
    + temporaries."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # not implemented on every backend and jax version
        return None
    if stats is None:
        return None
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
              "temp_size_in_bytes", "generated_code_size_in_bytes")
    sizes = {f: int(getattr(stats, f, 0) or 0) for f in fields}
    total = (sizes["argument_size_in_bytes"] + sizes["output_size_in_bytes"]
             - sizes["alias_size_in_bytes"] + sizes["temp_size_in_bytes"])
    return {"xla_memory_gib": total / GIB, "xla_memory_bytes": sizes}


def peak_memory_gib() -> float | None:
    """The most device memory any local device has held in this process (None on backends
    without allocator statistics, as XLA:CPU)."""
    import jax

    peak = max((d.memory_stats() or {}).get("peak_bytes_in_use", 0) for d in jax.local_devices())
    return peak / GIB if peak else None


def gemm_calls(compiled) -> dict:
    """On a GPU: how many cuBLAS(Lt) GEMM calls the compiled step makes, and how many of
    them are cuBLASLt FP8 GEMMs (what USE_FP8 needs XLA to emit for its speed)."""
    import jax

    if jax.default_backend() != "gpu":
        return {}
    try:
        text = compiled.as_text()
    except Exception:  # not every jax version or backend gives the optimized HLO
        return {}
    return {"fp8_gemms": text.count(FP8_GEMM_CALL),
            "cublas_gemms": text.count('custom_call_target="__cublas$')}


def measure_paxloom(exp, steps: int, warmup: int, peak_tflops: float = 0.0,
                    loss_steps: int = 0, config=None, device_memory_gb: float = 0.0,
                    profile_steps: int = 0) -> dict:
    """Train `exp` (its `config`, exp.run_config() unless given) as main.py would and
    measure it; with `profile_steps`, that many more steps under jax's profiler, summarized
    per kernel (bench/profile_summary.py) as the row's "profile". UserError when its
    compiled step cannot fit what the device can give (its allocator's limit, or
    `device_memory_gb`, main.py's --device_memory_gb)."""
    import jax
    from praxis import pax_fiddle

    from paxloom.runner.cluster import mesh as mesh_lib
    from paxloom.runner.training import memory_check, throughput
    from paxloom.runner.training.prefetch import Prefetcher
    from paxloom.runner.training.trainer import Trainer

    if config is None:
        config = exp.run_config()
    run = pax_fiddle.build(config)
    mesh = mesh_lib.create_mesh(run.mesh.ici_mesh_shape, run.mesh.dcn_mesh_shape)
    trainer = Trainer(run, mesh, "/tmp/paxloom-bench", peak_tflops=peak_tflops)
    state = trainer.init_state()
    prefetcher = Prefetcher(trainer.make_train_input(), trainer.to_device)
    try:
        batch, _ = next(prefetcher)
        # Compiled ahead of the loop, to time compilation alone and read XLA's memory
        # analysis; the jitted step's first call below reuses this executable.
        start = time.perf_counter()
        with jax.set_mesh(trainer.mesh):
            compiled = trainer.train_step.lower(state, batch).compile()
        compile_s = time.perf_counter() - start
        # A step that cannot fit stops here, in one line, not in XLA's out-of-memory error
        # at its first call (whose traceback would be all the row says).
        memory_check.check_fits(compiled, jax.local_devices(), device_memory_gb)
        xla_memory = memory_analysis(compiled)
        gemms = gemm_calls(compiled)
        del compiled
        start = time.perf_counter()
        with jax.set_mesh(trainer.mesh):  # the first step, which the Trainer also waits for
            state, metrics = trainer.train_step(state, batch)
        first_loss = float(metrics["loss"])
        first_step_s = time.perf_counter() - start
        state, metrics = train_steps(trainer, state, prefetcher, warmup)
        jax.block_until_ready((state, metrics))
        clock = CompletionClock()
        start = time.perf_counter()
        state, metrics = train_steps(trainer, state, prefetcher, steps, clock)
        jax.block_until_ready((state, metrics))
        window_s = time.perf_counter() - start
        done = clock.close()
        steps_run = 1 + warmup + steps
        profile = None
        if profile_steps:
            trace_dir = tempfile.mkdtemp(prefix="paxloom-profile-")
            with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
                state, metrics = train_steps(trainer, state, prefetcher, profile_steps)
                jax.block_until_ready((state, metrics))
            profile = profile_summary.summarize(trace_dir, profile_steps)
            steps_run += profile_steps
        # Untimed, up to --loss_steps steps in all: the loss that FP8 rows compare.
        if loss_steps > steps_run:
            state, metrics = train_steps(trainer, state, prefetcher, loss_steps - steps_run)
            jax.block_until_ready((state, metrics))
            steps_run = loss_steps
    finally:
        prefetcher.close()
    step_s = statistics.median(b - a for a, b in itertools.pairwise([start, *done]))
    tokens_per_step = trainer.global_batch_size * run.model_shape.seq_len
    tokens_per_s = tokens_per_step / step_s
    mfu = (tokens_per_s * trainer.flops_per_token / (jax.device_count() * trainer.peak_flops)
           if trainer.peak_flops else None)
    return {
        "resolved": attention_used(config), "packed": exp.PACKED_INPUT,
        "checkpoint_policy": exp.CHECKPOINT_POLICY, "params": trainer.num_params,
        # N of MFU's 6N: a token's share of the experts (all of a dense model's weights).
        "active_params": throughput.matmul_param_count(state["params"],
                                                       run.model_shape.expert_share),
        "global_batch": trainer.global_batch_size, "seq_len": run.model_shape.seq_len,
        "compile_s": compile_s, "first_step_s": first_step_s, "step_s": step_s,
        "mean_step_s": window_s / steps, "tokens_per_s": tokens_per_s, "mfu": mfu,
        "peak_memory_gib": peak_memory_gib(), **(xla_memory or {}), **gemms,
        "fp8": exp.USE_FP8, "fprop_dtype": exp.FPROP_DTYPE,
        "loss": first_loss, "last_loss": float(metrics["loss"]), "steps_run": steps_run,
        "device": jax.devices()[0].device_kind, "devices": jax.device_count(),
        "jax": jax.__version__, **({"profile": profile} if profile is not None else {}),
    }


def settings_of(pairs: list[str]) -> dict:
    """--set NAME=VALUE pairs -> {NAME: value}, each value a Python literal or else a string."""
    settings = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--set {pair!r}: expected NAME=VALUE")
        try:
            settings[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            settings[name] = value
    return settings


def sweep_of(pairs: list[str]) -> list[list[str]]:
    """--sweep NAME=V1,V2 pairs -> each row's variants: the --set pairs of each, the product
    of the sweeps in order ([[]] without any). Each value as --set reads it: a Python
    literal (8, [1,2,1], 'x') or else a string."""
    axes = []
    for pair in pairs:
        name, sep, values = pair.partition("=")
        if not sep or not name or not values:
            raise ValueError(f"--sweep {pair!r}: expected NAME=VALUE,VALUE...")
        try:
            parsed = ast.literal_eval(values + ",")
            texts = [str(v) if isinstance(v, (bool, int, float)) else repr(v) for v in parsed]
        except (ValueError, SyntaxError):
            texts = values.split(",")
        axes.append([f"{name}={text}" for text in texts])
    return [list(variant) for variant in itertools.product(*axes)]


def row_command(args, name: str, impl: str, variant: list[str], torch: bool = False) -> str:
    """The command line that measures this row alone, as a table row's `command`: what the
    row is (config, implementation, batch, settings) and how long it ran, not where its
    figures went."""
    argv = ["bench/gpu_bench.py", "--configs", name, "--impls", impl]
    if args.percore_batch_size:
        argv += ["--percore_batch_size", f"{args.percore_batch_size:g}"]
    if args.unpacked:
        argv.append("--unpacked")
    for setting in [*args.set, *variant]:
        argv += ["--set", setting]
    if args.fp8:
        argv.append("--fp8")
    if torch:
        argv.append("--torch")
    argv += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.loss_steps and (args.fp8 or args.loss_steps > 1 + args.warmup + args.steps):
        argv += ["--loss_steps", str(args.loss_steps)]
    if args.tiny:
        argv.append("--tiny")
    if args.peak_tflops:
        argv += ["--peak_tflops", f"{args.peak_tflops:g}"]
    if args.device_memory_gb:
        argv += ["--device_memory_gb", f"{args.device_memory_gb:g}"]
    return shlex.join(argv)


def run_one(args) -> int:
    """--one CONFIG IMPL: measure one row here and print it as one JSON line."""
    name, impl = args.one
    row = {"experiment": name, "attention": impl, "tiny": args.tiny, "steps": args.steps,
           "fp8": args.fp8, "settings": args.settings}
    try:
        if impl == "torch":
            from bench import torch_gpt

            exp = experiment(name, impl, tiny=args.tiny, devices=1,
                             percore_batch_size=args.percore_batch_size, unpacked=True)
            row.update(torch_gpt.measure(exp, args.steps, args.warmup, args.peak_tflops))
        else:
            import jax

            # The compile column is a cold compile, whatever cache main.py would use.
            jax.config.update("jax_enable_compilation_cache", False)
            exp = experiment(name, impl, tiny=args.tiny, devices=jax.device_count(),
                             percore_batch_size=args.percore_batch_size,
                             unpacked=args.unpacked, fp8=args.fp8, settings=args.settings)
            config = exp.run_config()
            about = describe(exp, config)
            print(ABOUT_PREFIX + json.dumps(about), flush=True)
            row.update(about)
            row.update(measure_paxloom(exp, args.steps, args.warmup, args.peak_tflops,
                                       args.loss_steps, config=config,
                                       device_memory_gb=args.device_memory_gb,
                                       profile_steps=args.profile_steps))
    except Exception as e:  # a failed config (UserError, OOM, ...) is a row, not the end
        row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:400]}"
    print(ROW_PREFIX + json.dumps(row), flush=True)
    return 0


def torch_installed() -> bool:
    """Whether torch can be imported here (looked up, not imported: that takes seconds)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or blocked installation
        return False


def on_accelerator(impl: str) -> bool:
    """Whether a row of `impl` run here would run on a GPU (or TPU). A torch row asks
    torch, so that its process never starts jax on the GPU, which would hold memory."""
    if impl == "torch":
        if not torch_installed():
            return False
        import torch

        return torch.cuda.is_available()
    import jax

    return jax.default_backend() != "cpu"


def run_probe() -> int:
    """--probe: what the children will run on, without the parent touching a device (a
    parent holding the GPU would leave its children less memory)."""
    import jax

    device = jax.devices()[0]
    print(ROW_PREFIX + json.dumps({
        "backend": jax.default_backend(), "device": device.device_kind,
        "devices": jax.device_count(), "jax": jax.__version__}), flush=True)
    return 0


def dry_run(args, configs: list[str], impls: list[str]) -> int:
    """--dry_run: what bench/gpu_check.sh --dry-run asks of this script on a CPU machine,
    that each row's hyperparameters are valid and its graph builds, in seconds. Off a GPU
    the graph is built for an H100 (as --mode=plan --plan_device=h100 builds it), so that
    rows of GPU-only kernels (cudnn, pallas) and FP8 build too."""
    from paxloom.core.target import TargetDevice, this_process

    target = this_process()
    if target.platform != "gpu":
        target = TargetDevice(platform="gpu", kind="NVIDIA H100 80GB HBM3",
                              compute_capability=(9, 0), planned=True)
    rows = list(itertools.product(configs, impls, args.variants, sorted({False, args.fp8})))
    for name, impl, variant, fp8 in rows:
        try:
            experiment(name, impl, tiny=bool(args.tiny), devices=1,
                       percore_batch_size=args.percore_batch_size, unpacked=args.unpacked,
                       fp8=fp8, settings={**args.settings, **settings_of(variant)},
                       ).run_config(target=target)
        except Exception as e:  # UserError for a bad value, anything else from the graph
            print(f"error: {name} {impl} {' '.join(variant)}{' fp8' if fp8 else ''}: {e}",
                  file=sys.stderr)
            return 1
    print(f"dry run: {len(rows)} row(s) build")
    return 0


# ----- the parent: a child per row ------------------------------------------------------


def about_line(stdout: str) -> dict:
    """The row's description (describe) that a child printed before it measured, if any."""
    for line in stdout.splitlines():
        if line.startswith(ABOUT_PREFIX):
            return json.loads(line[len(ABOUT_PREFIX):])
    return {}


def child(argv: list[str], timeout_s: float, env: dict | None = None) -> dict:
    """Run this script with `argv` in a fresh process; its row, or an error row (with what
    the child said of the row before it was killed)."""
    command = [sys.executable, os.path.abspath(__file__), *argv]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              cwd=REPO_ROOT, env=env)
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""  # bytes on POSIX, whatever `text` says
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        return {**about_line(out), "error": f"timed out after {timeout_s:.0f}s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(ROW_PREFIX):
            return json.loads(line[len(ROW_PREFIX):])
    # Killed (out of host memory, a crash in a kernel): the last words are on stderr.
    tail = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    sys.stderr.write("\n".join(tail[-20:]) + "\n")
    return {**about_line(done.stdout),
            "error": f"exit status {done.returncode}: {tail[-1][:300] if tail else ''}"}


def child_argv(args, name: str, impl: str, fp8: bool = False,
               variant: list[str] = ()) -> list[str]:
    argv = ["--one", name, impl, "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--tiny" if args.tiny else "--no-tiny", "--peak_tflops", str(args.peak_tflops),
            "--loss_steps", str(args.loss_steps), "--device_memory_gb",
            str(args.device_memory_gb), "--profile_steps", str(args.profile_steps)]
    if fp8:
        argv.append("--fp8")
    if args.percore_batch_size:
        argv += ["--percore_batch_size", str(args.percore_batch_size)]
    if args.unpacked:
        argv.append("--unpacked")
    for setting in [*args.set, *variant]:  # a variant's come last: they win
        argv += ["--set", setting]
    return argv


def fp8_summary(pairs: list[tuple[dict, dict]]) -> list[str]:
    """One line per (bfloat16 row, FP8 row): the speed ratio and both losses."""
    lines = []
    for base, fp8 in pairs:
        name = f"{base['experiment']} {base['attention']}"
        if "error" in base or "error" in fp8:
            lines.append(f"  {name}: {(base.get('error') or fp8.get('error'))}")
            continue
        lines.append(
            f"  {name}: FP8 {fp8['tokens_per_s']:,.0f} vs bf16 {base['tokens_per_s']:,.0f} "
            f"tokens/s = x{fp8['vs_bf16']:.2f}; loss after {fp8['steps_run']} steps: "
            f"FP8 {fp8['last_loss']:.4f}, bf16 {base['last_loss']:.4f} "
            f"({fp8['loss_delta']:+.4f})")
    return lines


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    by_name_only = MOE_CONFIGS + LONG_CONFIGS
    default = [c for c in CONFIGS if c not in by_name_only]
    parser.add_argument("--configs", default=",".join(default),
                        help=f"comma-separated, of {', '.join(CONFIGS)} (default: all but "
                             f"{', '.join(by_name_only)})")
    parser.add_argument("--impls", default="auto,praxis",
                        help="comma-separated ATTENTION_IMPLs: praxis, xla, cudnn, pallas, auto")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed steps after the first (compiling) one")
    parser.add_argument("--percore_batch_size", type=float, default=None,
                        help="override every experiment's PERCORE_BATCH_SIZE")
    parser.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=None,
                        help="2 layers x 64 (default on CPU)")
    parser.add_argument("--unpacked", action="store_true",
                        help="PACKED_INPUT=False in every row (plain causal attention)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a hyperparameter for every row, over the row's own (repeatable; "
                             "e.g. --set MAX_SEGMENTS_PER_SEQ=32)")
    parser.add_argument("--sweep", action="append", default=[], metavar="NAME=V1,V2",
                        help="run each row once per value of a hyperparameter, in order, "
                             "over --set (repeatable: every combination; e.g. --sweep "
                             "MAX_SEGMENTS_PER_SEQ=8,16)")
    parser.add_argument("--fp8", action="store_true",
                        help="after each row, the same with USE_FP8=True, its speed over the "
                             "bfloat16 row's and the loss of both after --loss_steps steps")
    parser.add_argument("--loss_steps", type=int, default=None,
                        help="train each row to this many steps in all (untimed after the "
                             "timed window) and report that step's loss (default: 100 with "
                             "--fp8, else no extra steps)")
    parser.add_argument("--torch", action="store_true",
                        help="also time bench/torch_gpt.py's PyTorch peer of each GPT "
                             "experiment and show the ratio")
    parser.add_argument("--peak_tflops", type=float, default=0.0,
                        help="peak TFLOP/s per device for MFU (default: paxloom/runner/training/throughput.py's "
                             "table)")
    parser.add_argument("--device_memory_gb", type=float, default=0.0,
                        help="the memory (GB) each device has, as main.py's flag: a row whose "
                             "compiled step needs more is an error row (default: what the "
                             "device's allocator says; none on CPU)")
    parser.add_argument("--profile_steps", type=int, default=0,
                        help="after the timed window, profile this many steps and keep each "
                             "kernel's time a step in the row's 'profile' (bench/"
                             "step_account.py --profile reads it)")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds one row may take")
    parser.add_argument("--json", default="runs/gpu_bench.json")
    parser.add_argument("--one", nargs=2, metavar=("CONFIG", "IMPL"),
                        help="run one row in this process and print it as JSON (IMPL 'torch': "
                             "the PyTorch peer)")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dry_run", action="store_true",
                        help="only build every row's experiment and graph (one device, full "
                             "shapes unless --tiny) and measure nothing: bench/gpu_check.sh "
                             "--dry-run checks its command lines this way on CPU")
    return parser


def main() -> int:
    parser = arguments()
    args = parser.parse_args()
    if args.probe:
        return run_probe()
    configs, impls = args.configs.split(","), args.impls.split(",")
    try:
        args.settings = settings_of(args.set)
        args.variants = sweep_of(args.sweep)
        for variant in args.variants:
            settings_of(variant)
    except ValueError as e:
        parser.error(str(e))
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown config {unknown[0]!r}; choose from {', '.join(CONFIGS)}")
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be at least 1 and --warmup at least 0")
    if args.loss_steps is None:
        args.loss_steps = 100 if args.fp8 and not args.one else 0
    if args.one:
        if args.tiny is None:
            args.tiny = not on_accelerator(args.one[1])
        return run_one(args)
    if args.dry_run:
        return dry_run(args, configs, impls)

    # Without preallocation, the probe's look at the GPU is quick and leaves nothing behind.
    probe = child(["--probe"], 300, env={**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    if "error" in probe:
        print(f"error: cannot start jax: {probe['error']}", file=sys.stderr)
        return 1
    if args.tiny is None:
        args.tiny = probe["backend"] == "cpu"
    run_torch = args.torch and torch_installed()
    if args.torch and not run_torch:
        print("--torch: torch is not installed here; no PyTorch peer rows")
    print(f"device: {probe['device']} x {probe['devices']}, jax {probe['jax']}, "
          f"{'tiny shapes' if args.tiny else 'full shapes'}, {args.warmup} warm-up + "
          f"{args.steps} timed steps, a process per row")
    print(f"MFU against the {'bfloat16 dense ' if args.fp8 else ''}peak of "
          f"paxloom/runner/training/throughput.py (or --peak_tflops); loss: of the last step "
          f"({max(args.loss_steps, 1 + args.warmup + args.steps)} in all)")
    print(HEADER)
    fp8_pairs = run_rows(args, probe, configs, impls, run_torch)
    if fp8_pairs:
        print("FP8 against bfloat16 (MFU of both against the bfloat16 dense peak):")
        print("\n".join(fp8_summary(fp8_pairs)))
    print(f"wrote {args.json}")
    return 0


def run_rows(args, probe: dict, configs: list[str], impls: list[str],
             run_torch: bool) -> list[tuple[dict, dict]]:
    """Every row, each in a child process, printed and written to --json as it finishes;
    returns the (bfloat16, FP8) row pairs of --fp8."""
    rows, fp8_pairs = [], []
    today = datetime.date.today().isoformat()
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)

    def record(row: dict) -> None:
        """Print the row and rewrite the JSON file with every row so far: a run cut off
        (bench/gpu_check.sh's time limit) keeps the rows it finished."""
        print(format_row(row), flush=True)
        rows.append(row)
        torch_version = next((r["torch"] for r in rows if r.get("torch")), None)
        for done in rows:
            done.setdefault("device", probe["device"])
            done.setdefault("devices", probe["devices"])
            done.setdefault("date", today)  # this machine's, as the children's
            done.update(jax=probe["jax"], torch=torch_version, tiny=args.tiny)
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)

    for name in configs:
        peer = None
        if run_torch and name in TORCH_CONFIGS:
            peer = {"experiment": name, "attention": "torch",
                    **child(child_argv(args, name, "torch"), args.timeout),
                    "command": row_command(args, name, "torch", [])}
            record(peer)
            if "error" in peer or "skipped" in peer:
                peer = None
        for impl, variant in itertools.product(impls, args.variants):
            # The settings, as the child would say them: a row killed before it did still
            # shows which variant it was.
            row = {"experiment": name, "attention": impl,
                   "settings": {**args.settings, **settings_of(variant)},
                   **child(child_argv(args, name, impl, variant=variant), args.timeout),
                   "command": row_command(args, name, impl, variant, torch=peer is not None)}
            if peer is not None and "error" not in row:
                # Per device: the torch peer runs on one.
                row["vs_torch"] = row["tokens_per_s"] / row["devices"] / peer["tokens_per_s"]
            record(row)
            if args.fp8:
                fp8 = {"experiment": name, "attention": impl,
                       **child(child_argv(args, name, impl, fp8=True, variant=variant),
                               args.timeout),
                       "command": row_command(args, name, impl, variant)}
                if "error" not in fp8 and "error" not in row:
                    fp8["vs_bf16"] = fp8["tokens_per_s"] / row["tokens_per_s"]
                    fp8["loss_delta"] = fp8["last_loss"] - row["last_loss"]
                record(fp8)
                fp8_pairs.append((row, fp8))
    return fp8_pairs


if __name__ == "__main__":
    sys.exit(main())
