"""A dropless top-k mixture-of-experts feed-forward (Mixtral, Qwen-MoE), on the mesh.

`MoeFeedForward` replaces a decoder layer's feed-forward (praxis's TransformerFeedForward)
with `num_experts` gated MLPs and a router; each token goes to its `num_experts_per_token`
best experts and gets their outputs weighted by the router. The layer keeps the
feed-forward's contract: pre-norm, residual connection, paddings in, same shape out.

How it computes (Gale et al. 2023, "MegaBlocks"; MaxText's and Megatron's dropless
layers): the token-expert assignments are sorted by expert and each expert's rows are
multiplied by its weights with one grouped matmul (`jax.lax.ragged_dot`), so no token is
dropped and no padding is computed. With `capacity_factor` > 0, each expert takes at most
ceil(capacity_factor * L * k / E) assignments of each sequence (the top-1 choices before
the top-2, earlier tokens first); the rest are dropped, as GShard's capacity does, and
`backend="padded"` may compute the experts as batched matmuls over a buffer of each
expert's capacity instead (`expert_mlp`): XLA:GPU in jax 0.10.2 lowers `ragged_dot` to one
dense matmul over every expert (docs/guides/moe.md). `backend="tokamax"` runs the same
grouped matmuls with tokamax's `ragged_dot` (an optional extra, `pip install .[moe]`),
which picks its Pallas grouped-GEMM kernels on GPUs and XLA's `ragged_dot` elsewhere.

Expert parallelism: the experts' weights are split over the mesh axis `expert_axis`
(`data` by default, like praxis's GLaM sharding) and their hidden dimension over the
tensor axis. Inside `shard_map`, each device sorts its own tokens' assignments by the
device that owns the expert, sends them with one fixed-size `all_to_all` (a buffer of
every local assignment per peer: exact for dropless routing; `capacity_factor` bounds it,
and so does `buffer_factor`, which drops what overflows it), runs its local experts, and
sends the results back. The router runs outside, on the
global batch, so its losses do not depend on the sharding.

Router losses are praxis aux losses (added to the training loss by praxis's
TransformerLm): the load-balancing loss of Switch/Mixtral, E * sum_e f_e * p_e with f_e
the fraction of top-k assignments to expert e and p_e its mean router probability
(transformers' `load_balancing_loss_func`), and the router z-loss of ST-MoE (Zoph et al.
2022), mean(logsumexp(logits)^2). Step metrics (core.step_metrics) report both, the
fraction of assignments dropped and the busiest expert's load over the mean.
"""

import math

import jax
import jax.numpy as jnp
from praxis import base_layer, pax_fiddle
from praxis.layers import activations, normalizations, transformers

from paxloom.core.mesh_axes import BATCH_AXES
from paxloom.core.step_metrics import report_step_metric

template_field = base_layer.template_field
WeightHParams = base_layer.WeightHParams
# The experts' matmuls (`expert_mlp`); experiments/groups.py checks MOE_BACKEND against it.
BACKENDS = ("ragged_dot", "padded", "tokamax")
# tokamax releases known to fail on a jax release (by major.minor), what they fail with, and
# where that was seen: tokamax declares jax>=0.9.2 and does not refuse these itself.
TOKAMAX_FAILS_ON = {("0.0.12", "0.11"): "Mesh.__init__() got an unexpected keyword argument "
                                         "'out_shape' (an H200, jax 0.11.2, 2026-11-27)"}


def tokamax_problem(tokamax_version: str, jax_version: str) -> str | None:
    """Why tokamax `tokamax_version` cannot run on jax `jax_version`, or None."""
    failure = TOKAMAX_FAILS_ON.get((tokamax_version, ".".join(jax_version.split(".")[:2])))
    return None if failure is None else (
        f"tokamax {tokamax_version} fails on jax {jax_version}: {failure}")


# The per-expert weights ([E, ...]) of this layer and of praxis's GShard layer (GLaM), by
# parameter name inside a decoder layer's `ff_layer`: a token uses k of their E slices.
EXPERT_WEIGHTS = ("wi_gate", "wi_up", "wo", "wi_0", "wi_gate_0", "wo_0")


def route(logits: jax.Array, k: int, renormalize: bool):
    """(weights [T, k], experts [T, k], probabilities [T, E]) of router `logits` [T, E]:
    the softmax over all experts, its top k, renormalised to sum to 1 if asked."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, k)
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts, probs


def capacity_keep(experts: jax.Array, live: jax.Array, num_experts: int,
                  capacity: int) -> jax.Array:
    """[B, L, k] booleans: which assignments of live tokens (`live` [B, L] > 0) fit their
    expert's per-sequence `capacity`; padding takes no room.

    Within a sequence the top-1 choices of all tokens come first, then the top-2 ones
    (GShard's order), earlier tokens before later ones."""
    b, length, k = experts.shape
    by_priority = jnp.swapaxes(experts, 1, 2).reshape(b, k * length)
    counted = jnp.tile(live > 0, (1, k))[..., None]  # [B, k*L, 1], same order
    one_hot = jax.nn.one_hot(by_priority, num_experts, dtype=jnp.int32) * counted
    rank = jnp.sum((jnp.cumsum(one_hot, axis=1) - 1) * one_hot, axis=-1)  # [B, k*L]
    fits = (rank < capacity) & counted[..., 0]
    return jnp.swapaxes(fits.reshape(b, k, length), 1, 2)


def grouped_matmul(backend: str):
    """The ragged_dot(rows [R, D], weights [E, D, H], group_sizes [E]) of a backend."""
    if backend == "tokamax":
        import tokamax  # the optional [moe] extra; experiments/groups.py checks it is there
        from absl import flags

        # tokamax reads its settings from absl flags and, where no program parsed them,
        # parses sys.argv itself, which fails on other programs' arguments (a script with
        # argparse, bench/gpu_bench.py): take its defaults there.
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        return tokamax.ragged_dot
    return jax.lax.ragged_dot


def grouped_mlp(rows, group_sizes, w_gate, w_up, w_down, activation,
                ragged_dot=jax.lax.ragged_dot):
    """act(rows @ w_gate[e]) * (rows @ w_up[e]) @ w_down[e] for each row's expert e.

    `rows` [R, D] are sorted by expert, `group_sizes` [E] count them; rows past the sum
    of `group_sizes` come out zero."""
    gate = ragged_dot(rows, w_gate, group_sizes)
    up = ragged_dot(rows, w_up, group_sizes)
    return ragged_dot(activation(gate) * up, w_down, group_sizes)


def expert_mlp(rows, ids, num_experts, w_gate, w_up, w_down, activation, padded_rows=0,
               ragged_dot=jax.lax.ragged_dot):
    """`grouped_mlp` of `rows` [R, D] sorted by their expert `ids` [R] (id `num_experts`:
    computes nothing, comes out zero), by one of two ways:

    - padded_rows = 0 ("ragged_dot", "tokamax"): grouped matmuls over exactly the rows
      there are, by `ragged_dot`;
    - padded_rows = C > 0, "padded": each expert's rows in a [E, C, D] buffer and batched
      matmuls over it (MaxText's and GShard's dense dispatch). The caller guarantees no
      expert has more than C rows (a capacity path); padding rows compute zeros.
    """
    if not padded_rows:
        return grouped_mlp(rows, jnp.bincount(ids, length=num_experts), w_gate, w_up, w_down,
                           activation, ragged_dot)
    counts = jnp.bincount(ids, length=num_experts)
    start = jnp.cumsum(counts) - counts
    rank = jnp.arange(ids.size) - start[jnp.minimum(ids, num_experts - 1)]
    trash = num_experts * padded_rows
    slot = jnp.where(ids < num_experts, ids * padded_rows + rank, trash)
    buffer = jnp.zeros((trash + 1, rows.shape[-1]), rows.dtype).at[slot].set(rows)[:trash]
    buffer = buffer.reshape(num_experts, padded_rows, -1)
    gate = jnp.einsum("ecd,edh->ech", buffer, w_gate)
    up = jnp.einsum("ecd,edh->ech", buffer, w_up)
    out = jnp.einsum("ech,ehd->ecd", activation(gate) * up, w_down).reshape(trash, -1)
    return jnp.concatenate([out, jnp.zeros_like(out[:1])])[slot]


def _experts_local(x, experts, weights, w_gate, w_up, w_down, *, num_experts, activation,
                   expert_axis, expert_shards, tensor_axis, buffer_rows, padded_rows=0,
                   ragged_dot=jax.lax.ragged_dot):
    """The MoE output [T, D] of tokens `x` [T, D] whose assignments are `experts` and
    `weights` [T, k] (a dropped assignment has expert id `num_experts`), on one shard.

    With `expert_shards` > 1 this runs inside shard_map: `w_*` hold this shard's
    experts, and assignments travel to their owners over `expert_axis` in buffers of
    `buffer_rows` rows per peer. `padded_rows` > 0 (the "padded" backend): each expert's
    capacity for the tokens of one shard; otherwise `ragged_dot` computes the experts.
    Returns (output, number of assignments that did not fit).
    """
    tokens, k = experts.shape
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sorted_experts = flat[order]
    rows = x[order // k]
    overflow = jnp.zeros((), jnp.int32)
    if expert_shards == 1:
        out_sorted = expert_mlp(rows, sorted_experts, num_experts, w_gate, w_up, w_down,
                                activation, padded_rows, ragged_dot)
        if tensor_axis:
            out_sorted = jax.lax.psum(out_sorted, tensor_axis)
    else:
        local_experts = num_experts // expert_shards
        owner = sorted_experts // local_experts  # a dropped assignment: expert_shards
        counts = jnp.bincount(owner, length=expert_shards)
        start = jnp.cumsum(counts) - counts
        position = jnp.arange(flat.size) - start[jnp.minimum(owner, expert_shards - 1)]
        sent = (owner < expert_shards) & (position < buffer_rows)
        overflow = jnp.sum((owner < expert_shards) & ~sent)
        trash = expert_shards * buffer_rows  # the slot that unsent rows are written to
        slot = jnp.where(sent, owner * buffer_rows + position, trash)
        send_rows = jnp.zeros((trash + 1, x.shape[-1]), x.dtype).at[slot].set(rows)
        send_ids = jnp.full((trash + 1,), local_experts, jnp.int32).at[slot].set(
            sorted_experts % local_experts)

        def exchange(a):
            a = a[:trash].reshape(expert_shards, buffer_rows, *a.shape[1:])
            return jax.lax.all_to_all(a, expert_axis, 0, 0, tiled=True)

        received, received_ids = exchange(send_rows), exchange(send_ids)
        received = received.reshape(trash, -1)
        received_ids = received_ids.reshape(trash)
        local_order = jnp.argsort(received_ids, stable=True)
        # A local expert receives from every shard: expert_shards x the capacity per shard.
        out = expert_mlp(received[local_order], received_ids[local_order], local_experts,
                         w_gate, w_up, w_down, activation, expert_shards * padded_rows,
                         ragged_dot)
        if tensor_axis:
            out = jax.lax.psum(out, tensor_axis)
        out = jnp.zeros_like(out).at[local_order].set(out)
        returned = jax.lax.all_to_all(out.reshape(expert_shards, buffer_rows, -1),
                                      expert_axis, 0, 0, tiled=True).reshape(trash, -1)
        returned = jnp.concatenate([returned, jnp.zeros_like(returned[:1])])
        out_sorted = returned[slot]
    out = jnp.zeros_like(out_sorted).at[order].set(out_sorted).reshape(tokens, k, -1)
    combined = jnp.einsum("tkd,tk->td", out.astype(jnp.float32), weights)
    return combined.astype(x.dtype), overflow


class MoeFeedForward(base_layer.BaseLayer):
    """A dropless top-k MoE feed-forward with gated experts (see the module docstring).

    Attributes:
      input_dims: model width.
      hidden_dims: set by praxis's Transformer from the stack; not read (see
        expert_hidden_dims).
      expert_hidden_dims: each expert's hidden width.
      num_experts: routed experts.
      num_experts_per_token: k of the top-k routing.
      renormalize_top_k: the k router weights of a token sum to 1 (Mixtral), or stay the
        softmax's probabilities (Qwen2-MoE's norm_topk_prob=False).
      capacity_factor: 0: dropless; > 0: per-sequence capacity of each expert, in units
        of the mean load L * k / E.
      load_balancing_weight, router_z_loss_weight: the router losses' weights.
      shared_hidden_dims: > 0: a shared expert of this hidden width that every token
        goes through (Qwen2-MoE), its output added to the routed experts'.
      gate_shared_expert: the shared expert's output is scaled by sigmoid(x @ w).
      backend: the experts' matmuls: "ragged_dot" (grouped, over exactly the rows routed),
        "tokamax" (the same by tokamax's kernels) or "padded" (batched over a buffer of
        each expert's capacity; needs one).
      buffer_factor: 0: each peer's all_to_all buffer holds every local assignment (no
        drop, whatever the routing); > 0: this many times a peer's mean share (the local
        assignments / the expert shards), the assignments past it dropped.
      expert_axis: the mesh axis the experts are split over (None: replicated).
      tensor_axis: the mesh axis each expert's hidden dimension is split over.
      batch_axes: the mesh axes the tokens' batch dimension is split over (inside a
        pipeline stage not `stage`, which praxis's pipeline maps the stages over).
    """

    input_dims: int = 0
    hidden_dims: int = 0
    expert_hidden_dims: int = 0
    num_experts: int = 0
    num_experts_per_token: int = 2
    renormalize_top_k: bool = True
    capacity_factor: float = 0.0
    load_balancing_weight: float = 0.0
    router_z_loss_weight: float = 0.0
    shared_hidden_dims: int = 0
    gate_shared_expert: bool = False
    backend: str = "ragged_dot"
    buffer_factor: float = 0.0
    expert_axis: str | None = "data"
    tensor_axis: str | None = "mdl"
    batch_axes: tuple[str, ...] = BATCH_AXES
    ln_tpl: pax_fiddle.Config = template_field(normalizations.RmsNorm)
    activation_tpl: pax_fiddle.Config = template_field(activations.SiLU)
    add_skip_connection: bool = True
    # Set by praxis's Transformer on its feed-forward; this layer has no dropout and only
    # the pre-norm policy (validated in setup).
    relu_dropout_prob: float = 0.0
    residual_dropout_prob: float = 0.0
    residual_droppath_prob: float = 0.0
    norm_policy: str = "pre"
    # Set by praxis's StackedTransformer on its `moe_layer_tpl`; not read.
    num_groups: int = 1
    min_group_size: int | None = None
    gating_func: str = "top2"

    class WeightSharding(transformers.TransformerFeedForwardMoe.WeightSharding):
        """praxis's sharding helpers set these fields on a feed-forward or MoE template;
        this layer lays its weights out by `expert_axis` and `tensor_axis` instead."""

        ffn0: base_layer.SplitDimsMapping = None
        ffn1: base_layer.SplitDimsMapping = None

    class ActivationSharding(transformers.TransformerFeedForwardMoe.ActivationSharding):
        ffn0: base_layer.SplitDimsMapping = None
        ffn1: base_layer.SplitDimsMapping = None
        ffn0_extend_step: base_layer.SplitDimsMapping = None
        ffn1_extend_step: base_layer.SplitDimsMapping = None

    def setup(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"MoE backend {self.backend!r}: expected one of {BACKENDS}")
        if self.backend == "padded" and self.capacity_factor <= 0:
            raise ValueError("the padded MoE backend needs a capacity (capacity_factor > 0)")
        if not 1 <= self.num_experts_per_token <= self.num_experts:
            raise ValueError(f"num_experts_per_token={self.num_experts_per_token} must be "
                             f"in [1, num_experts={self.num_experts}]")
        if (self.relu_dropout_prob or self.residual_dropout_prob
                or self.residual_droppath_prob or self.norm_policy != "pre"):
            raise ValueError("MoeFeedForward has no dropout and only norm_policy='pre'")
        d, h, e = self.input_dims, self.expert_hidden_dims, self.num_experts
        sharded = self.mesh_axis_names is not None
        expert_in = [self.expert_axis, None, self.tensor_axis] if sharded else None
        expert_out = [self.expert_axis, self.tensor_axis, None] if sharded else None
        self.create_variable("router", WeightHParams(
            shape=[d, e], mesh_shape=self.mesh_shape,
            tensor_split_dims_mapping=[None, None] if sharded else None))
        for name in ("wi_gate", "wi_up"):
            self.create_variable(name, WeightHParams(
                shape=[e, d, h], mesh_shape=self.mesh_shape,
                tensor_split_dims_mapping=expert_in))
        self.create_variable("wo", WeightHParams(
            shape=[e, h, d], mesh_shape=self.mesh_shape, tensor_split_dims_mapping=expert_out))
        if self.shared_hidden_dims:
            hs = self.shared_hidden_dims
            for name in ("shared_gate", "shared_up"):
                self.create_variable(name, WeightHParams(
                    shape=[d, hs], mesh_shape=self.mesh_shape,
                    tensor_split_dims_mapping=[None, self.tensor_axis] if sharded else None))
            self.create_variable("shared_down", WeightHParams(
                shape=[hs, d], mesh_shape=self.mesh_shape,
                tensor_split_dims_mapping=[self.tensor_axis, None] if sharded else None))
            if self.gate_shared_expert:
                self.create_variable("shared_expert_gate", WeightHParams(
                    shape=[d, 1], mesh_shape=self.mesh_shape,
                    tensor_split_dims_mapping=[None, None] if sharded else None))
        ln = self.ln_tpl.clone()
        ln.dim = d
        self.create_child("layer_norm", ln)
        self.create_child("activation", self.activation_tpl.clone())

    def __call__(self, inputs, paddings=None, segment_ids=None):
        residual = inputs
        x = self.layer_norm(inputs)
        b, length, d = x.shape
        k, e = self.num_experts_per_token, self.num_experts
        live = (jnp.ones((b, length), jnp.float32) if paddings is None
                else 1.0 - paddings.astype(jnp.float32))
        logits = jnp.einsum("bld,de->ble", x.astype(jnp.float32),
                            self.theta.router.astype(jnp.float32))
        weights, experts, probs = route(logits, k, self.renormalize_top_k)
        if self.capacity_factor > 0:
            capacity = math.ceil(self.capacity_factor * length * k / e)
            keep = capacity_keep(experts, live, e, capacity)
        else:
            keep = jnp.ones(experts.shape, bool)
        # A dropped assignment goes to the sentinel expert e, which computes nothing.
        routed = jnp.where(keep, experts, e)
        routed_weights = jnp.where(keep, weights, 0.0)
        out, overflow = self._experts(x, routed, routed_weights)
        if self.shared_hidden_dims:
            out = out + self._shared_expert(x)
        out = out * live[..., None].astype(out.dtype)
        self._router_losses(logits, probs, experts, keep, live)
        dropped = jnp.sum(jnp.where(keep, 0.0, live[..., None])) + overflow
        report_step_metric(self, "moe/dropped_fraction", dropped / (jnp.sum(live) * k))
        return residual + out if self.add_skip_connection else out

    def _experts(self, x, routed, routed_weights):
        """shard_map over the mesh in the training context (expert parallelism), plain
        computation outside one (one device, or a model applied without a mesh)."""
        b, length, d = x.shape
        k, e = self.num_experts_per_token, self.num_experts
        theta = self.theta
        mesh = jax.sharding.get_abstract_mesh()
        activation = self.activation
        ragged_dot = grouped_matmul(self.backend)
        # "padded": an expert takes at most its per-sequence capacity from each sequence.
        per_sequence = math.ceil(self.capacity_factor * length * k / e)
        padded = per_sequence if self.backend == "padded" else 0
        if self.mesh_axis_names is None or mesh.empty:
            out, overflow = _experts_local(
                x.reshape(-1, d), routed.reshape(-1, k), routed_weights.reshape(-1, k),
                theta.wi_gate, theta.wi_up, theta.wo, num_experts=e, activation=activation,
                expert_axis=None, expert_shards=1, tensor_axis=None, buffer_rows=0,
                padded_rows=b * padded, ragged_dot=ragged_dot)
            return out.reshape(b, length, d), overflow
        P = jax.sharding.PartitionSpec
        sizes = dict(mesh.shape)
        shards = sizes[self.expert_axis] if self.expert_axis else 1
        tensor = self.tensor_axis if self.tensor_axis and sizes[self.tensor_axis] > 1 else None
        batch_shards = math.prod(sizes[a] for a in self.batch_axes)
        local_assignments = (b // batch_shards) * length * k
        buffer_rows = local_assignments
        if self.capacity_factor > 0:  # kept assignments per owner are bounded by capacity
            buffer_rows = min(buffer_rows, (b // batch_shards) * (e // shards) * per_sequence)
        if self.buffer_factor > 0:
            buffer_rows = min(buffer_rows,
                              math.ceil(self.buffer_factor * local_assignments / shards))

        def body(x, routed, routed_weights, w_gate, w_up, w_down):
            bl = x.shape[0]
            out, overflow = _experts_local(
                x.reshape(-1, d), routed.reshape(-1, k), routed_weights.reshape(-1, k),
                w_gate, w_up, w_down, num_experts=e, activation=activation,
                expert_axis=self.expert_axis, expert_shards=shards, tensor_axis=tensor,
                buffer_rows=buffer_rows, padded_rows=bl * padded, ragged_dot=ragged_dot)
            overflow = jax.lax.psum(overflow, self.batch_axes)
            return out.reshape(bl, length, d), overflow

        tokens = P(self.batch_axes, None, None)
        expert_in = P(self.expert_axis, None, self.tensor_axis)
        expert_out = P(self.expert_axis, self.tensor_axis, None)
        return jax.shard_map(
            body, in_specs=(tokens, tokens, tokens, expert_in, expert_in, expert_out),
            out_specs=(tokens, P()), check_vma=False,
        )(x, routed, routed_weights, theta.wi_gate, theta.wi_up, theta.wo)

    def _shared_expert(self, x):
        theta = self.theta
        gate = jnp.einsum("bld,dh->blh", x, theta.shared_gate)
        up = jnp.einsum("bld,dh->blh", x, theta.shared_up)
        out = jnp.einsum("blh,hd->bld", self.activation(gate) * up, theta.shared_down)
        if self.gate_shared_expert:
            out = out * jax.nn.sigmoid(jnp.einsum("bld,do->blo", x, theta.shared_expert_gate))
        return out

    def _router_losses(self, logits, probs, experts, keep, live):
        """The load-balancing and z losses (over live tokens), as praxis aux losses."""
        e = self.num_experts
        tokens = jnp.maximum(jnp.sum(live), 1.0)
        assignments = jax.nn.one_hot(experts, e) * live[..., None, None]  # [B, L, k, E]
        fraction = jnp.sum(assignments, axis=(0, 1, 2)) / tokens  # per expert, summing to k
        mean_prob = jnp.sum(probs * live[..., None], axis=(0, 1)) / tokens
        balance = e * jnp.sum(fraction * mean_prob)
        z = jnp.sum(jax.nn.logsumexp(logits, axis=-1) ** 2 * live) / tokens
        if self.load_balancing_weight:
            self.add_aux_loss("moe_load_balancing_loss", self.load_balancing_weight * balance)
        if self.router_z_loss_weight:
            self.add_aux_loss("moe_router_z_loss", self.router_z_loss_weight * z)
        report_step_metric(self, "moe/load_balancing_loss", balance)
        report_step_metric(self, "moe/router_z_loss", z)
        kept = jnp.sum(assignments * keep[..., None], axis=(0, 1, 2))
        report_step_metric(self, "moe/max_expert_load", jnp.max(kept) / jnp.maximum(
            jnp.mean(kept), 1e-9))


def with_experts(stack: pax_fiddle.Config, moe: pax_fiddle.Config, interval: int) -> None:
    """Make every `interval`-th decoder layer of `stack` (the last of each `interval`) a
    mixture of experts `moe` (a MoeFeedForward config), in place.

    Every layer: the layer template's feed-forward is `moe`. Every Nth: praxis's
    StackedTransformer puts `moe` at its `moe_layers`; a repeated (scanned) stack scans a
    block of N layers, the last one a mixture, NUM_LAYERS / N times (as praxis's GLaM
    stacks scan [MoE, dense] pairs).
    """
    from layers.stack import transformer_layer_template

    layer = transformer_layer_template(stack)
    moe = moe.clone()
    if moe.ln_tpl is not None and layer.tr_fflayer_tpl.ln_tpl is not None:
        moe.ln_tpl = layer.tr_fflayer_tpl.ln_tpl.clone()  # the family's own norm
    moe.activation_tpl = layer.tr_fflayer_tpl.activation_tpl.clone()
    if interval == 1:
        layer.tr_fflayer_tpl = moe
        return
    block = stack.block if issubclass(stack.cls, transformers.StackedTransformerRepeated) \
        else stack
    if block is not stack:
        stack.x_times = stack.x_times * block.num_layers // interval
        block.num_layers = interval
    block.moe_layers = [i for i in range(block.num_layers) if (i + 1) % interval == 0]
    block.num_experts = moe.num_experts
    block.moe_layer_tpl = moe
