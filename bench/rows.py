"""What a benchmark row is, shared by bench/gpu_bench.py and bench/torch_gpt.py: the
experiments they measure, how a row's experiment is built, and how a row prints. gpu_bench.py
imports torch_gpt.py (its PyTorch rows) and both import this module, so torch_gpt.py never
needs gpu_bench.py and no two of them import each other."""

SYNTHETIC = {"DATASET": "synthetic", "LAMBADA_EVAL": False}
# Qwen3-30B-A3B's shape cut to 4 of its 48 layers, one 2048-token sequence per device: on
# one H100 jax 0.10.2's XLA:GPU computes ragged_dot as a dense matmul over every expert,
# whose [tokens x k, experts, width] operand makes 4096 tokens plan at 94 GiB, 2048 at 62.
QWEN3_4_LAYERS = {**SYNTHETIC, "NUM_LAYERS": 4, "MAX_SEQ_LEN": 2048}
LLAMA8B_4_LAYERS = {**SYNTHETIC, "NUM_LAYERS": 4}
# Per row: its overrides, and whether its weights are split over the devices (FSDP) or
# copied to each (data parallelism). A row is the registered experiment of its name, or the
# one ROW_EXPERIMENT names. An ATTENTION_IMPL among the overrides is what "auto" runs.
CONFIGS = {
    "Synthetic126M": ({}, "dp"),
    "GPT1_3B": (SYNTHETIC, "fsdp"),
    "Synthetic5B": ({"NUM_LAYERS": 8}, "fsdp"),
    "Llama1B": (SYNTHETIC, "fsdp"),
    # Mixtures of experts (bench/gpu_check.sh's moe part), not in gpu_bench.py's default.
    # The dropless layer (layers/moe.py) against the dense Llama with a token's parameters
    # (HIDDEN_DIMS = k x MOE_HIDDEN_DIMS; the router's 4 x 262,144 are the difference).
    "Qwen3A3B_moe": (QWEN3_4_LAYERS, "fsdp"),
    "Qwen3A3B_dense": ({**QWEN3_4_LAYERS, "NUM_EXPERTS": 0, "HIDDEN_DIMS": 8 * 768}, "fsdp"),
    # The same grouped matmuls by tokamax's Pallas kernels (its Mosaic GPU kernel on an
    # H100), where XLA:GPU's ragged_dot may be the dense lowering above.
    "Qwen3A3B_tokamax": ({**QWEN3_4_LAYERS, "MOE_BACKEND": "tokamax"}, "fsdp"),
    # The same mixture with a capacity, its experts as batched matmuls over each expert's
    # capacity ("padded"): planned with 12.5 GiB of temporaries where ragged_dot's dense
    # lowering by XLA:GPU (jax 0.10.2) plans 27.7 (docs/guides/moe.md).
    "Qwen3A3B_padded": ({**QWEN3_4_LAYERS, "CAPACITY_FACTOR": 1.25, "MOE_BACKEND": "padded"},
                        "fsdp"),
    # Pax's GLaM (praxis's GShard layers, top-2, capacity 2.0) with all 64 experts: 44.5 GiB
    # planned on one H100. NUM_GPUS follows the mesh; its attention can only be praxis's.
    "GLaM126M64E": ({**SYNTHETIC, "ATTENTION_IMPL": "praxis"}, "fsdp"),
    # Long sequences on one GPU (bench/gpu_check.sh's long part), not in gpu_bench.py's
    # default: Llama 3.1 8B's shape cut to 4 layers, one sequence a step. Planned by XLA:GPU
    # for one H100 (jax 0.10.2): 65536 tokens 66.5 GiB with the experiment's checkpointing
    # (fits, 67.7 usable); 131072 86.5 GiB with 'save_nothing' (fits an H200, not an H100).
    "Llama8B_64K": ({**LLAMA8B_4_LAYERS, "MAX_SEQ_LEN": 65536}, "fsdp"),
    "Llama8B_128K": ({**LLAMA8B_4_LAYERS, "MAX_SEQ_LEN": 131072,
                      "CHECKPOINT_POLICY": "save_nothing"}, "fsdp"),
}
ROW_EXPERIMENT = {"Qwen3A3B_moe": "Qwen3MoE30B_A3B", "Qwen3A3B_dense": "Qwen3MoE30B_A3B",
                  "Qwen3A3B_tokamax": "Qwen3MoE30B_A3B", "Qwen3A3B_padded": "Qwen3MoE30B_A3B",
                  "GLaM126M64E": "PileGLaM126M64E", "Llama8B_64K": "Llama31_8B",
                  "Llama8B_128K": "Llama31_8B"}
MOE_CONFIGS = ("Qwen3A3B_moe", "Qwen3A3B_dense", "Qwen3A3B_tokamax", "Qwen3A3B_padded",
               "GLaM126M64E")
LONG_CONFIGS = ("Llama8B_64K", "Llama8B_128K")  # shortest first
# The experiments bench/torch_gpt.py can mirror: the GPT family (Llama is another model).
TORCH_CONFIGS = ("Synthetic126M", "GPT1_3B", "Synthetic5B")
TINY = dict(NUM_LAYERS=2, MODEL_DIMS=64, HIDDEN_DIMS=256, NUM_HEADS=4, DIMS_PER_HEAD=16,
            MAX_SEQ_LEN=128, VOCAB_SIZE=512, PERCORE_BATCH_SIZE=1)
# With --tiny, on top of TINY: the dense peer's HIDDEN_DIMS stays k x MOE_HIDDEN_DIMS.
TINY_ROW = {name: {"MOE_HIDDEN_DIMS": 256 // 8}
            for name in ("Qwen3A3B_moe", "Qwen3A3B_tokamax", "Qwen3A3B_padded")}


def experiment(name: str, impl: str, *, tiny: bool, devices: int,
               percore_batch_size: float | None = None, unpacked: bool = False,
               fp8: bool = False, settings: dict | None = None):
    """The experiment instance of one row: CONFIGS' overrides on a mesh of `devices`, then
    `settings` (gpu_bench.py --set) over everything."""
    import experiments  # here, not above: gpu_bench's parent process never builds one

    overrides, layout = CONFIGS[name]
    cls = experiments.resolve(f"experiments.{ROW_EXPERIMENT.get(name, name)}")
    row_settings = {
        **overrides,
        "ICI_MESH_SHAPE": [devices, 1, 1] if layout == "dp" else [1, devices, 1],
        "DCN_MESH_SHAPE": [1, 1, 1],
        "EVAL_BATCHES": 0,
        **(TINY if tiny else {}),
        **(TINY_ROW.get(name, {}) if tiny else {}),
    }
    if "NUM_GPUS" in cls.hyperparameter_types():  # GLaM checks it against the mesh (Pax's)
        row_settings["NUM_GPUS"] = devices
    if impl != "torch" and not (impl == "auto" and "ATTENTION_IMPL" in overrides):
        row_settings["ATTENTION_IMPL"] = impl
    if unpacked:
        row_settings["PACKED_INPUT"] = False
    if fp8:
        row_settings["USE_FP8"] = True
    if percore_batch_size:
        row_settings["PERCORE_BATCH_SIZE"] = percore_batch_size
    return cls(**{**row_settings, **(settings or {})})


HEADER = (f"{'experiment':<14} {'attention':<14} {'gemm':<4} {'packed':<6} {'params':>8} "
          f"{'batch':>10} {'compile':>8} {'step':>9} {'tokens/s':>11} {'MFU':>6} {'peak':>7} "
          f"{'XLA est':>7} {'vs torch':>8} {'loss':>7} {'vs bf16':>7} {'f8 GEMMs':>8}")
DTYPES = {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}


def format_row(row: dict) -> str:
    impl = row["attention"]
    if row.get("resolved") and row["resolved"] != impl:
        impl = f"{impl}>{row['resolved']}"
    gemm = "fp8" if row.get("fp8") else DTYPES.get(row.get("fprop_dtype"), "")
    start = f"{row['experiment']:<14} {impl:<14} {gemm:<4}"
    if "error" in row:
        return f"{start} error: {row['error']}"
    if "skipped" in row:
        return f"{start} skipped: {row['skipped']}"

    def gib(value):  # a tiny CPU model's few MiB must not print as 0.00G
        if not value:
            return "-"
        return f"{value:.1f}G" if value >= 1 else f"{value * 1024:.0f}M"

    mfu = f"{row['mfu']:.1%}" if row.get("mfu") else "-"
    ratio = f"x{row['vs_torch']:.2f}" if row.get("vs_torch") else ""
    vs_bf16 = f"x{row['vs_bf16']:.2f}" if row.get("vs_bf16") else ""
    loss = f"{row['last_loss']:.4f}" if row.get("last_loss") is not None else ""
    gemms = (f"{row['fp8_gemms']}/{row['cublas_gemms']}" if row.get("cublas_gemms") is not None
             else "-")
    batch = f"{row['global_batch']}x{row['seq_len']}"
    return (f"{start} {'yes' if row['packed'] else 'no':<6} {row['params'] / 1e6:>7.1f}M "
            f"{batch:>10} {row['compile_s']:>7.1f}s {row['step_s'] * 1e3:>7.1f}ms "
            f"{row['tokens_per_s']:>11,.0f} {mfu:>6} {gib(row.get('peak_memory_gib')):>7} "
            f"{gib(row.get('xla_memory_gib')):>7} {ratio:>8} {loss:>7} {vs_bf16:>7} "
            f"{gemms:>8}")
