"""Token generation on the devices: prefill, then one token per step, in one jitted loop.

`make_generate` compiles, for one batch shape, a function (params, prompts) -> tokens that
runs the prompt through the cached decoder (layers/cached_lm.py), a chunk of
`prefill_chunk` tokens at a time (chunked prefill: each chunk attends to the cache so far,
so a long prompt's attention scores and activations exist for one chunk at a time, not for
the whole prompt at once), then picks a token,
feeds it back and repeats inside `lax.while_loop` until every row has stopped: no host
round trip per token. A row stops at EOS, after `steps` tokens, or when prompt plus
continuation fill the model's context (MAX_SEQ_LEN input tokens).

Sampling draws each prompt's tokens from its own key, fold_in(seed, prompt index, step),
so a prompt's continuation depends on the seed, not on which prompts share its batch.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from layers import cached_lm
from layers.architecture import Architecture, canonical_weights
from paxloom.core.errors import UserError

STOPPED = -1  # fills a row's token slots after it has stopped


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
    """How the next token is chosen: greedy (temperature 0), or sampled from the softmax
    at `temperature`, restricted to the `top_k` most likely tokens and to the smallest set
    whose probability reaches `top_p` (in that order, as Hugging Face's generate)."""

    temperature: float = 0.0
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0  # 1: no limit
    seed: int = 0

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise UserError(f"--temperature={self.temperature}: must be >= 0 (0 decodes "
                            f"greedily, 1 samples from the model's distribution)")
        if self.top_k < 0:
            raise UserError(f"--top_k={self.top_k}: must be >= 0 (0 keeps every token)")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top_p={self.top_p}: must be in (0, 1] (1 keeps every token)")
        if not -2**31 <= self.seed < 2**31:
            raise UserError(f"--decode_seed={self.seed}: must fit in 32 bits")
        if self.greedy and (self.top_k or self.top_p < 1):
            raise UserError("--top_k and --top_p restrict sampling, which --temperature=0 "
                            "(greedy) does not do; set --temperature > 0, e.g. 0.8")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def select_tokens(logits, keys, options: SamplingOptions):
    """logits [B, V] float32, keys [B] -> next tokens [B] int32."""
    if options.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / options.temperature
    if options.top_k and options.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, options.top_k)[0][:, -1:]  # [B, 1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if options.top_p < 1:
        ranked = jnp.sort(logits, axis=-1)[:, ::-1]  # descending
        probs = jax.nn.softmax(ranked, axis=-1)
        # Keep a token while the mass ranked above it is below top_p (the first always).
        keep = (jnp.cumsum(probs, axis=-1) - probs) < options.top_p
        threshold = jnp.min(jnp.where(keep, ranked, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return jax.vmap(jax.random.categorical)(keys, logits).astype(jnp.int32)


def prefill(arch: Architecture, weights: dict, prompts, positions, cache: list[dict],
            first_slot, chunk: int):
    """Run the left-padded prompts [B, P] through the cached decoder into slots 0 .. P-1,
    `chunk` tokens at a time (0, or P or more: at once). Returns (the last slot's hidden
    state [B, D], the cache)."""
    prompt_len = prompts.shape[1]
    if not chunk or chunk >= prompt_len:
        hidden, cache = cached_lm.forward(arch, weights, prompts, positions, cache, 0,
                                          first_slot)
        return hidden[:, -1], cache
    if prompt_len % chunk:
        raise ValueError(f"a prefill chunk of {chunk} tokens does not divide {prompt_len}")

    def one_chunk(index, carry):
        start = index * chunk
        piece = lambda x: jax.lax.dynamic_slice_in_dim(x, start, chunk, axis=1)  # noqa: E731
        hidden, cache = cached_lm.forward(arch, weights, piece(prompts), piece(positions),
                                          carry[1], start, first_slot)
        return hidden[:, -1], cache

    # The first chunk outside the loop gives the carry its shape.
    carry = one_chunk(0, (None, cache))
    return jax.lax.fori_loop(1, prompt_len // chunk, one_chunk, carry)


def make_generate(arch: Architecture, *, mesh: Mesh, param_shardings, batch: int,
                  prompt_len: int, steps: int, max_seq_len: int, eos_id: int | None,
                  options: SamplingOptions, prefill_chunk: int = 0):
    """A jitted generate(params, prompts [B, P], lengths [B], rows [B], seed) -> tokens
    [B, steps].

    `prefill_chunk`: the prompt enters the cache this many tokens at a time (it must divide
    P); 0, or P or more, runs it in one pass.

    Prompts are left-padded: row b's `lengths[b]` tokens end at slot P - 1. `rows` are the
    prompts' indices and `seed` the sampling seed (options.seed is not used: one program
    serves every seed). Output rows hold the generated tokens, the EOS included, then
    STOPPED.
    """
    dtype = jnp.dtype(arch.fprop_dtype)

    def generate(params, prompts, lengths, rows, seed):
        # praxis computes in the fprop dtype from float32 parameters; so does this.
        weights = jax.tree_util.tree_map(lambda w: w.astype(dtype),
                                         canonical_weights(params, arch))
        first_slot = prompt_len - lengths  # [B]
        cache = cached_lm.init_cache(arch, batch, prompt_len + steps - 1, dtype)
        positions = jnp.maximum(jnp.arange(prompt_len)[None, :] - first_slot[:, None], 0)
        last_hidden, cache = prefill(arch, weights, prompts, positions, cache, first_slot,
                                     prefill_chunk)
        row_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
            jax.random.key(seed), rows)
        # Token j is predicted from prompt + j tokens, which must fit the context.
        limit = jnp.minimum(steps, max_seq_len - lengths + 1)  # [B]

        def emit(step, last_hidden, out, done):
            keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, step)
            token = select_tokens(cached_lm.logits(weights, last_hidden), keys, options)
            out = out.at[:, step].set(jnp.where(done, STOPPED, token))
            done = done | (step + 1 >= limit)
            if eos_id is not None:
                done = done | (token == eos_id)
            return token, out, done

        out = jnp.full((batch, steps), STOPPED, jnp.int32)
        token, out, done = emit(0, last_hidden, out, jnp.zeros(batch, bool))

        def body(state):
            step, token, cache, out, done = state
            # Token step-1 enters slot P + step - 1, at position length + step - 1.
            hidden, cache = cached_lm.forward(
                arch, weights, token[:, None], (lengths + step - 1)[:, None], cache,
                prompt_len + step - 1, first_slot)
            token, out, done = emit(step, hidden[:, 0], out, done)
            return step + 1, token, cache, out, done

        def running(state):
            step, _, _, _, done = state
            return (step < steps) & ~jnp.all(done)

        return jax.lax.while_loop(running, body, (jnp.int32(1), token, cache, out, done))[3]

    replicated = NamedSharding(mesh, P())
    return jax.jit(generate, in_shardings=(param_shardings, *[replicated] * 4),
                   out_shardings=replicated)
