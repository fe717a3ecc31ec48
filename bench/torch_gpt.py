"""A plain PyTorch GPT of a Paxloom GPT experiment's shape: the peer that
`bench/gpu_bench.py --torch` measures Paxloom against, on one device.

The model is what layers/gpt.py builds, written directly: token embedding plus learned
positions; per layer a pre-LayerNorm attention block (one QKV projection and an output
projection, all with biases; torch.nn.functional.scaled_dot_product_attention, causal) and
a pre-LayerNorm feed-forward block (biases, tanh-approximated GELU); a final LayerNorm;
output logits through the tied token embedding, no bias. It trains as the experiment
says: AdamW with its learning rate, betas, epsilon and weight decay on every parameter
(fused on a GPU), global-norm gradient clipping, float32 weights with bf16 autocast when
FPROP_DTYPE is bfloat16, and each layer recomputed in the backward pass
(torch.utils.checkpoint) when the experiment rematerialises (CHECKPOINT_POLICY other than
"none"), so both sides do about the same work. Rows are random token ids, a few batches
cycled from pinned host memory. On a GPU the model is torch.compile'd; on CPU it runs
eagerly (for --tiny smoke tests). torch is imported only when measuring: without it, the
script says so in one line and exits 0.

Figures are those of gpu_bench.py's rows: the step time is the median over the timed
steps of the intervals between CUDA events recorded after each step (the loop never
waits for the device until the window ends); MFU uses paxloom/runner/training/throughput.py's FLOPs per
token and peak table. torch compiles lazily, inside the first step, so compile_s is the
first step's time less a steady step's.

    python bench/torch_gpt.py --config Synthetic126M --steps 20
    python bench/torch_gpt.py --config Synthetic5B --steps 10        # gpu_bench's 8 layers
    python bench/torch_gpt.py --config Synthetic126M --tiny --steps 2   # CPU smoke test
"""

import argparse
import itertools
import json
import os
import statistics
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # runner, bench

from bench.rows import HEADER, TORCH_CONFIGS, experiment, format_row  # noqa: E402

GIB = 2**30
AUTOCAST_DTYPES = {"bfloat16": "bfloat16", "float16": "float16"}  # FPROP_DTYPE -> torch's


def import_torch():
    """torch, or None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def gpt_class(torch):
    """The model classes, defined once torch is imported (it is optional here)."""
    from torch.utils import checkpoint as activation_checkpoint

    nn, functional = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, dims: int, hidden: int, heads: int, head_dims: int, eps: float):
            super().__init__()
            self.heads, self.head_dims = heads, head_dims
            self.attention_norm = nn.LayerNorm(dims, eps=eps)
            self.qkv = nn.Linear(dims, 3 * heads * head_dims)
            self.out = nn.Linear(heads * head_dims, dims)
            self.mlp_norm = nn.LayerNorm(dims, eps=eps)
            self.up = nn.Linear(dims, hidden)
            self.down = nn.Linear(hidden, dims)

        def forward(self, x):
            batch, length, _ = x.shape
            qkv = self.qkv(self.attention_norm(x)).view(batch, length, 3, self.heads,
                                                        self.head_dims)
            query, key, value = (t.transpose(1, 2) for t in qkv.unbind(2))  # [B, N, T, H]
            context = functional.scaled_dot_product_attention(query, key, value,
                                                              is_causal=True)
            x = x + self.out(context.transpose(1, 2).reshape(batch, length, -1))
            hidden = functional.gelu(self.up(self.mlp_norm(x)), approximate="tanh")
            return x + self.down(hidden)

    class GPT(nn.Module):
        def __init__(self, exp):
            super().__init__()
            dims = exp.MODEL_DIMS
            self.token_embedding = nn.Embedding(exp.VOCAB_SIZE, dims)
            self.position_embedding = nn.Embedding(exp.MAX_SEQ_LEN, dims)
            self.blocks = nn.ModuleList(
                Block(dims, exp.HIDDEN_DIMS, exp.NUM_HEADS, exp.DIMS_PER_HEAD,
                      exp.LAYERNORM_EPSILON) for _ in range(exp.NUM_LAYERS))
            self.final_norm = nn.LayerNorm(dims, eps=exp.LAYERNORM_EPSILON)
            self.remat = exp.CHECKPOINT_POLICY != "none"
            # Gaussian weights and zero biases, with the experiment's standard deviations
            # (the tied embedding has its own), so the first loss is about ln(vocabulary).
            for name, param in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(param)
                elif "norm" in name:
                    nn.init.ones_(param)
                else:
                    std = exp.SOFTMAX_INIT_STD if name.startswith("token") else exp.INIT_STD
                    nn.init.normal_(param, std=std)

        def forward(self, ids, labels):
            x = self.token_embedding(ids) + self.position_embedding.weight[:ids.shape[1]]
            for block in self.blocks:
                if self.remat and self.training:
                    x = activation_checkpoint.checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            logits = functional.linear(self.final_norm(x), self.token_embedding.weight)
            return functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                            labels.reshape(-1))

    return GPT


def measure(exp, steps: int, warmup: int, peak_tflops: float = 0.0) -> dict:
    """Train the torch peer of experiment `exp` on one device; gpu_bench.py's row fields."""
    torch = import_torch()
    if torch is None:
        return {"skipped": "torch is not installed"}
    if hasattr(exp, "NUM_KV_HEADS"):  # experiments/llama.py's family
        raise ValueError(f"{type(exp).__name__} is not a GPT; torch_gpt.py mirrors the GPT "
                         f"experiments only")
    from paxloom.runner.training import throughput

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(exp.RANDOM_SEED)
    model = gpt_class(torch)(exp).to(device)
    forward = torch.compile(model, dynamic=False) if cuda else model
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=exp.LEARNING_RATE, betas=(exp.ADAM_BETA1, exp.ADAM_BETA2),
        eps=exp.ADAM_EPSILON, weight_decay=exp.WEIGHT_DECAY, fused=cuda)
    autocast = getattr(torch, AUTOCAST_DTYPES.get(exp.FPROP_DTYPE, "float32"))

    def train_step(tokens):
        tokens = tokens.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=autocast, enabled=autocast != torch.float32):
            loss = forward(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        if exp.CLIP_GRADIENT_NORM_TO_VALUE > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), exp.CLIP_GRADIENT_NORM_TO_VALUE)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    # One device: the experiment's per-device batch (at least a row).
    batch, seq_len = max(1, int(exp.PERCORE_BATCH_SIZE)), exp.MAX_SEQ_LEN
    generator = torch.Generator().manual_seed(exp.TRAIN_INPUT_RANDOM_SEED)
    pool = [torch.randint(exp.VOCAB_SIZE, (batch, seq_len + 1), generator=generator)
            for _ in range(4)]
    if cuda:  # so the copy to the GPU is asynchronous, as Paxloom's prefetched batches
        pool = [tokens.pin_memory() for tokens in pool]

    first_loss, loss, first_step_s, intervals, window_s = _time_steps(
        torch, train_step, pool, steps, warmup)
    step_s = statistics.median(intervals)

    params = sum(p.numel() for p in model.parameters())  # the tied embedding once
    matmul_params = params - model.position_embedding.weight.numel()  # as throughput.py
    flops_per_token = throughput.flops_per_token(
        num_params=matmul_params, num_layers=exp.NUM_LAYERS, num_heads=exp.NUM_HEADS,
        dims_per_head=exp.DIMS_PER_HEAD, seq_len=seq_len)
    device_kind = torch.cuda.get_device_name() if cuda else "cpu"
    # throughput.py's table is keyed by device kind; only that attribute is read.
    peak_flops = (throughput.peak_flops_per_device(types.SimpleNamespace(
        device_kind=device_kind), peak_tflops) if cuda or peak_tflops else 0.0)
    tokens_per_s = batch * seq_len / step_s
    return {
        "packed": False, "checkpoint_policy": "per layer" if model.remat else "none",
        "params": params, "global_batch": batch, "seq_len": seq_len,
        "compile_s": max(first_step_s - step_s, 0.0), "first_step_s": first_step_s,
        "step_s": step_s, "mean_step_s": window_s / steps, "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * flops_per_token / peak_flops if peak_flops else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / GIB if cuda else None,
        "loss": first_loss, "last_loss": loss, "device": device_kind, "devices": 1,
        "torch": torch.__version__, "compiled": cuda,
    }


def _time_steps(torch, train_step, pool: list, steps: int, warmup: int):
    """(first loss, last loss, first step's seconds, each timed step's seconds, the timed
    window's seconds) of the first step (it compiles), `warmup` steps, then `steps` timed
    ones: by CUDA events on a GPU; on a CPU, eager, a step has finished when it returns."""
    cuda = torch.cuda.is_available()
    start = time.perf_counter()
    first_loss = float(train_step(pool[0]))  # compiles, forward and backward
    first_step_s = time.perf_counter() - start
    for i in range(warmup):
        loss = train_step(pool[(i + 1) % len(pool)])
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    if cuda:
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        marks[0].record()
        for i in range(steps):
            loss = train_step(pool[i % len(pool)])
            marks[i + 1].record()
        torch.cuda.synchronize()
        intervals = [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(marks)]
    else:
        done = [start]
        for i in range(steps):
            loss = train_step(pool[i % len(pool)])
            done.append(time.perf_counter())
        intervals = [b - a for a, b in itertools.pairwise(done)]
    return first_loss, float(loss), first_step_s, intervals, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="Synthetic126M",
                        help=f"one of {', '.join(TORCH_CONFIGS)}")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--percore_batch_size", type=float, default=None)
    parser.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=None,
                        help="2 layers x 64 (default without a GPU)")
    parser.add_argument("--peak_tflops", type=float, default=0.0)
    args = parser.parse_args()
    if args.config not in TORCH_CONFIGS:
        parser.error(f"--config: one of {', '.join(TORCH_CONFIGS)}")
    torch = import_torch()
    if torch is None:
        print("torch is not installed; skipping the PyTorch peer")
        return 0
    tiny = not torch.cuda.is_available() if args.tiny is None else args.tiny
    exp = experiment(args.config, "torch", tiny=tiny, devices=1,
                     percore_batch_size=args.percore_batch_size, unpacked=True)
    row = {"experiment": args.config, "attention": "torch", "tiny": tiny,
           **measure(exp, args.steps, args.warmup, args.peak_tflops)}
    print(HEADER)
    print(format_row(row))
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
