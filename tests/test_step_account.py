"""The step account (paxloom/runner/planning/step_account.py): FLOPs, bytes and groups read
from compiled programs whose answers are known by hand, the sum over its groups, the fused
attention kernel's work, and the per-kernel profile summary (bench/profile_summary.py)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

from bench import profile_summary
from paxloom.runner.planning import gpu_target, step_account
from paxloom.runner.planning.plan import DEVICE_KINDS
from tests.support.processes import run_python, session_env

needs_plugin = pytest.mark.skipif(not gpu_target.installed(),
                                  reason="XLA:GPU's plugin is not installed (make install)")

H200 = DEVICE_KINDS["h200"]


def compiled_text(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def test_a_matmul_counts_its_flops_and_each_operand_once():
    a = jnp.ones((64, 32), jnp.float32)
    b = jnp.ones((32, 16), jnp.float32)
    account = step_account.account(compiled_text(lambda a, b: a @ b, a, b), H200)
    [matmul] = [k for k in account.kernels if k.group == "matmuls"]
    assert matmul.flops == 2 * 64 * 32 * 16
    assert matmul.bytes == 4 * (64 * 32 + 32 * 16 + 64 * 16)
    assert matmul.seconds == pytest.approx(max(matmul.flops / H200.peak_flops,
                                               matmul.bytes / H200.memory_bytes_per_s))


def test_a_loop_counts_each_trip_and_only_the_slice_it_reads():
    # A scanned stack: each trip reads one [16, 16] layer of the [8, 16, 16] weights.
    weights = jnp.ones((8, 16, 16), jnp.float32)
    x = jnp.ones((4, 16), jnp.float32)

    def stack(weights, x):
        return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, weights)[0]

    account = step_account.account(compiled_text(stack, weights, x), H200)
    matmuls = [k for k in account.kernels if k.group == "matmuls"]
    assert sum(k.flops for k in matmuls) == 8 * 2 * 4 * 16 * 16
    assert {k.runs for k in matmuls} == {8}
    # Per trip at most the layer's weights, the carried activations and the result: never
    # the whole stack of weights.
    whole_stack = 8 * 16 * 16 * 4
    assert all(k.bytes / k.runs < whole_stack for k in account.kernels if k.runs == 8)
    # Loops over layers are where the account is not checked: it says so.
    assert step_account.SCANNED_NOTE in account.notes
    unrolled = step_account.account(compiled_text(lambda w, x: jnp.tanh(x @ w[0]), weights, x),
                                    H200)
    assert step_account.SCANNED_NOTE not in unrolled.notes


def test_the_total_is_every_group_and_every_kernel_is_in_one():
    @jax.named_scope("compute_loss")
    def loss(logits):
        return -jax.nn.log_softmax(logits).mean()

    def step(w, x):
        def model(w):
            return loss(jnp.transpose(x @ w) @ w.T)
        grad = jax.grad(model)(w)
        return w - 0.1 * grad

    w, x = jnp.ones((32, 32)), jnp.ones((32, 32))
    account = step_account.account(compiled_text(step, w, x), H200)
    groups = {g.name: g for g in account.groups}
    assert set(groups) == set(step_account.GROUPS)
    assert {k.group for k in account.kernels} <= set(step_account.GROUPS)
    assert groups["matmuls"].flops > 0 and groups["loss"].bytes > 0
    assert account.seconds == pytest.approx(sum(k.seconds for k in account.kernels))
    # The sum over groups is what guards the total: with a group left out of GROUPS, the
    # total misses that group's kernels.
    dropped = [name for name in step_account.GROUPS if name != "matmuls"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_account, "GROUPS", tuple(dropped))
        assert account.seconds < sum(k.seconds for k in account.kernels)


@pytest.mark.parametrize("scope,group", [
    ("lm/self_attention._dot_atten/einsum", "attention"),
    ("lm/self_attention._fused_context/einsum", "attention"),  # the grouped-query layer's
    ("jit(step)/jvp(lm.apply)/lm/ff_layer/einsum", "matmuls"),
])
def test_matmuls_in_attention_count_as_attention(scope, group):
    assert step_account._group("gemm", "custom-call", scope, matmul=True) == group


@pytest.mark.parametrize("name,op,scope,group", [
    ("loop_add_fusion", "fusion", "jit(s)/transpose(jvp(lm.apply))/lm/lm.compute_loss/mul", "loss"),
    ("loop_add_fusion.97", "fusion", "jit(_train_step)/add", "optimizer update"),
    ("input_transpose_fusion.3", "fusion", "jit(s)/jvp(lm.apply)/lm/x", "copies and transposes"),
    ("loop_add_fusion.2", "fusion", "jit(s)/jvp(lm.apply)/lm/layer_norm/add",
     "elementwise and reductions"),
])
def test_kernels_outside_matmuls_are_grouped_by_scope_and_kind(name, op, scope, group):
    assert step_account._group(name, op, scope, matmul=False) == group


def test_a_fused_kernel_replaces_its_stand_in():
    # One call on 2 rows of 8 tokens, 4 heads of 16: forward 2 matmuls of half the
    # [8, 8] scores per row and head; backward 2.5 times that.
    kernel = step_account.FusedAttention("cuDNN flash attention", calls=3, rows=2, seq_len=8,
                                         heads=4, kv_heads=4, head_dim=16)
    forward, backward = kernel.kernels(H200)
    per_call = 2 * (2 * 8 * 8 * 16) * 2 * 4 / 2
    assert forward.flops == 3 * per_call and backward.flops == 3 * 2.5 * per_call
    q = 2 * 8 * 4 * 16 * 2  # bf16
    assert forward.bytes == 3 * (4 * q + 2 * 8 * 4 * 4)  # Q, K, V, O and the statistics
    buffers = dataclasses.replace(kernel, own_buffer_bytes=1000).kernels(H200)[1]
    assert buffers.bytes - backward.bytes == 3 * 2 * 1000

    def attention(q):
        with jax.named_scope("_dot_atten"):
            return jnp.tanh(q @ q.T)

    account = step_account.account(compiled_text(attention, jnp.ones((8, 8))), H200,
                                   attention=kernel)
    assert [k.name for k in account.kernels if k.group == "attention"] == [
        "cuDNN flash attention forward", "cuDNN flash attention backward"]
    assert "in place of the" in account.notes[0]


def test_the_account_prints_every_group_and_the_measured_step():
    w = jnp.ones((64, 64))
    account = step_account.account(compiled_text(lambda w: jnp.tanh(w @ w), w), H200)
    text = "\n".join(step_account.lines(account, measured_s=1e-3, measured_label="a run",
                                        top=3))
    for name in step_account.GROUPS:
        assert re.search(rf"^  {re.escape(name)} +\d+ +[\d.]+ +[\d.]+ +[\d.]+$", text, re.M)
    assert "measured step 1.00 ms (a run)" in text and "Heaviest kernels (3 of" in text


def test_a_profile_names_the_kernels_the_account_lists(tmp_path):
    def train_step(a, b):
        return jnp.tanh(a @ b).sum()

    step = jax.jit(train_step)
    a = jnp.ones((128, 128))
    step(a, a).block_until_ready()
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        for _ in range(2):
            step(a, a).block_until_ready()
    summary = profile_summary.summarize(str(tmp_path), steps=2)
    account = step_account.account(step.lower(a, a).compile().as_text(), H200)
    assert summary and set(summary) <= {k.name for k in account.kernels}
    assert all(seconds > 0 for seconds in summary.values())
    measured = step_account.profile_by_group(account, summary)
    assert sum(measured.values()) == pytest.approx(sum(summary.values()))


def test_a_directory_without_a_trace_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="create_perfetto_trace=True"):
        profile_summary.summarize(str(tmp_path), steps=1)


@pytest.mark.process
@needs_plugin
def test_the_account_of_an_experiment_from_the_command_line():
    out = run_python("bench/step_account.py", "--fdl_config=experiments.Tiny",
                     "--fdl.ICI_MESH_SHAPE=[1,1,1]", "--device=h100", "--measured_ms=5",
                     "--top=4", env={**session_env(), "XLA_FLAGS": ""}, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Step account on one H100 80GB" in out.stdout
    assert "measured step 5.00 ms (--measured_ms)" in out.stdout
    assert "Heaviest kernels (4 of" in out.stdout
    bad = run_python("bench/step_account.py", "--fdl_config=experiments.Tiny", "--device=h100",
                     "--profile=/nonexistent.json", env=session_env(), timeout=600)
    assert bad.returncode == 2 and "--profile=/nonexistent.json: no such file" in bad.stderr
    assert "Traceback" not in bad.stderr
