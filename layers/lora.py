"""LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): low-rank
adapters beside praxis's projections, as Pax's LoRA (paxml's LoRAMixin, praxis's
contrib/gpu/scripts_gpu/lora_layers.py) defines them.

An adapted projection keeps its weight `w` and adds `lora_a` [in, r] and `lora_b` [out, r]:
its effective weight is `w + lora_a @ lora_b.T`, reshaped to w's shape (for a projection
to heads, out = heads x head dim). Pax applies no alpha / rank factor, so neither does
this. `lora_b` starts at zero, so an adapted model starts exactly equal to its base;
`lora_a` is drawn like the weight beside it (the layer's Gaussian). The names, shapes and
places of the adapters in the parameter tree are Pax's.

Pax adds `lora_a @ lora_b.T` to the weight before every use, which makes the backward pass
compute the full weight gradient (the low-rank gradients are derived from it). Here the
low-rank path runs beside the frozen weight instead, `x @ w + (x @ lora_a) @ lora_b.T`:
the same function, and the frozen weight's gradient, which the trainer never asks for
(paxloom/runner/state/optimizer.py freezes it), is never computed.

`add_lora` swaps the layer templates of an (unsharded) model config: the feed-forward
projections (ffn_layer1, ffn_layer1_gate, ffn_layer2), the attention's combined QKV
projection, its separate query/key/value projections (grouped-query and multi-query
attention) and its output projection. `merge_adapters` folds trained adapters into their
weights, for export and decoding (layers/architecture.py).

The adapters are replicated on every device, as Pax's are. They are small: at rank 8,
0.6M values per layer of GPT-5B's shape and 1.8M of GPT-175B's, so with their gradient and
Adam moments about 0.2 GiB (5B) and 2.5 GiB (175B) per device. Sharding them like their
weights' dimensions (lora_a's input over FSDP, lora_b's output over tensor parallelism)
would save that, but it deadlocked XLA:CPU's collectives under scanned layers
(USE_REPEATED_LAYER) on meshes with both FSDP and tensor parallelism ([1,4,2], [2,2,2]),
and replicated adapters need no collective in the forward pass.
"""

import copy
import re

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
from praxis import base_layer
from praxis.layers import attentions, linears, multi_query_attention

from layers.stack import transformer_layer_template

TARGET_LAYERS = ("all", "attention", "mlp")
ADAPTER_NAMES = ("lora_a", "lora_b")
# The parameters that train (Pax's bprop_variable_inclusion) and that a base checkpoint
# lacks (Pax's CHECKPOINT_IGNORE_RULES), over paths such as "lm/.../linear/lora_a".
ADAPTER_RULE = r"^.*lora.*$"


def _adapter_variables(layer, in_dims: int, out_dims: int,
                       leading: tuple[int, ...] = ()) -> None:
    """Create `layer`'s lora_a [*leading, in_dims, rank] (drawn like its `w`, or from
    `lora_init`) and lora_b [*leading, out_dims, rank] (zero), replicated (module
    docstring)."""
    if layer.rank < 1:
        raise ValueError(f"{type(layer).__name__}: LoRA rank must be >= 1, not {layer.rank}")
    w_init = layer._weight_hparams["w"].init

    def variable(dims, init):
        # Replicated, said outright: left unset, praxis sets it and logs an INFO line per
        # variable and trace, a hundred lines under --alsologtostderr.
        shape = [*leading, dims, layer.rank]
        return base_layer.WeightHParams(shape=shape, init=init, mesh_shape=layer.mesh_shape,
                                        tensor_split_dims_mapping=(-1,) * len(shape))

    layer.create_variable("lora_a", variable(in_dims, layer.lora_init or w_init))
    layer.create_variable("lora_b", variable(out_dims, base_layer.WeightInit.Constant(0.0)))


def _low_rank(x, a, b):
    """The adapter path `x @ a @ b.T` ([..., in] -> [..., out]), through the rank: never
    the full [in, out] product."""
    return jnp.einsum("...r,or->...o", jnp.einsum("...i,ir->...r", x, a), b)


def _check_layout(layer) -> None:
    if layer.attention_combine_dims or getattr(layer, "use_nhd_shape", False):
        raise NotImplementedError(f"{type(layer).__name__}: LoRA needs the [D, N, H] weight "
                                  f"layout (no attention_combine_dims, no use_nhd_shape)")


class Adapter(base_layer.BaseLayer):
    """The fields every adapted layer adds: the adapters' rank and lora_a's initialisation
    (None: the layer's own weight init)."""

    rank: int = 0
    lora_init: base_layer.WeightInit | None = None


class LoraLinear(linears.Linear, Adapter):
    """praxis Linear (w [in, out]) with lora_a [in, r] and lora_b [out, r]."""

    def setup(self) -> None:
        super().setup()
        _adapter_variables(self, self.input_dims, self.output_dims)

    def __call__(self, inputs):
        return super().__call__(inputs) + _low_rank(inputs, self.theta.lora_a,
                                                    self.theta.lora_b)


class LoraAttentionProjection(attentions.AttentionProjection, Adapter):
    """praxis AttentionProjection (w [D, N, H]) with lora_a [D, r] and lora_b [N*H, r], as a
    query/key/value projection ([..., D] -> [..., N, H]) or as the output projection
    ([..., N, H] -> [..., D])."""

    def setup(self) -> None:
        _check_layout(self)
        super().setup()
        _adapter_variables(self, self.input_dim, self.num_heads * self.dim_per_head)

    def __call__(self, inputs):
        out = super().__call__(inputs)
        x = self._cast_to_fprop_dtype(inputs)
        a, b = self.theta.lora_a, self.theta.lora_b
        if self.is_output_projection:  # [..., N, H] -> [..., D]: x_flat @ b @ a.T
            flat = x.reshape(*x.shape[:-2], self.num_heads * self.dim_per_head)
            delta = _low_rank(flat, b, a)
        else:  # [..., D] -> [..., N, H]: x @ a @ b.T
            delta = _low_rank(x, a, b).reshape(*x.shape[:-1], self.num_heads,
                                               self.dim_per_head)
        return out + delta


class LoraCombinedQKVProjection(attentions.CombinedQKVProjectionLayer, Adapter):
    """praxis CombinedQKVProjectionLayer (w [3, D, N, H]) with lora_a [3, D, r] and
    lora_b [3, N*H, r]: one adapter each for query, key and value."""

    def setup(self) -> None:
        _check_layout(self)
        super().setup()
        _adapter_variables(self, self.input_dim, self.num_heads * self.dim_per_head,
                           leading=(3,))

    def __call__(self, inputs):
        projections = super().__call__(inputs)
        low_rank = jnp.einsum("...d,kdr->k...r", inputs, self.theta.lora_a)
        delta = jnp.einsum("k...r,knr->k...n", low_rank, self.theta.lora_b)
        delta = delta.reshape(*delta.shape[:-1], self.num_heads, self.dim_per_head)
        return tuple(p + d for p, d in zip(projections, delta, strict=True))


class LoraOneHeadedAttentionProjection(multi_query_attention.OneHeadedAttentionProjection,
                                       Adapter):
    """praxis's key/value projection of multi-query attention (one head, w [D, H]) with
    lora_a [D, r] and lora_b [H, r]. (Pax's LoRA has no adapter for it.)"""

    def setup(self) -> None:
        super().setup()
        _adapter_variables(self, self.input_dim, self.output_dim)

    def __call__(self, inputs):
        return super().__call__(inputs) + _low_rank(self._cast_to_fprop_dtype(inputs),
                                                    self.theta.lora_a, self.theta.lora_b)


# praxis layer class -> its adapted subclass.
LORA_CLASSES = {
    linears.Linear: LoraLinear,
    attentions.AttentionProjection: LoraAttentionProjection,
    attentions.CombinedQKVProjectionLayer: LoraCombinedQKVProjection,
    multi_query_attention.OneHeadedAttentionProjection: LoraOneHeadedAttentionProjection,
}


def base_class(cls: type) -> type:
    """The praxis class a LoRA layer class adapts; any other class unchanged."""
    return next((base for base, lora in LORA_CLASSES.items() if cls is lora), cls)


def add_lora(model: fdl.Config, rank: int, target_layers: str) -> fdl.Config:
    """A copy of the praxis LanguageModel config `model` whose `target_layers` ("all",
    "attention" or "mlp") projections carry rank-`rank` adapters. Sharding may come before
    or after (the adapters are replicated on any mesh). ValueError (one line) for a bad
    argument or a projection of another class."""
    if target_layers not in TARGET_LAYERS:
        raise ValueError(f"LORA_TARGET_LAYERS={target_layers!r} is not one of "
                         f"{', '.join(TARGET_LAYERS)}")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LORA_RANK={rank!r} must be an integer >= 1")
    model = copy.deepcopy(model)
    layer = transformer_layer_template(model.lm_tpl.stacked_transformer_tpl)
    templates = []  # (owner config, name of its template field)
    if target_layers in ("all", "mlp"):
        templates.append((layer.tr_fflayer_tpl.fflayer_tpl, "linear_tpl"))
    if target_layers in ("all", "attention"):
        attention = layer.tr_atten_tpl
        # A DotProductAttention uses combined_qkv_proj_tpl only with combine_qkv, the
        # headless template only with one key/value head; proj_tpl always (for `post`).
        templates += [(attention, name) for name in ("combined_qkv_proj_tpl", "proj_tpl",
                                                     "headless_proj_tpl")
                      if getattr(attention, name, None) is not None]
    for owner, name in templates:
        _adapt(getattr(owner, name), f"{fdl.get_callable(owner).__name__}.{name}", rank)
    return model


def _adapt(template: fdl.Config, where: str, rank: int) -> None:
    cls = fdl.get_callable(template)
    lora_cls = LORA_CLASSES.get(base_class(cls))
    if lora_cls is None:
        raise ValueError(f"LoRA adapts praxis's {', '.join(c.__name__ for c in LORA_CLASSES)}; "
                         f"{where} is {cls.__name__}")
    fdl.update_callable(template, lora_cls)
    template.rank = rank


def is_adapter(path: str) -> bool:
    """Whether the parameter at `path` ("lm/.../linear/lora_a") is a LoRA adapter."""
    return re.match(ADAPTER_RULE, path) is not None


def merge_adapters(params: dict) -> dict:
    """The parameter tree with every adapted weight merged, `w + lora_a @ lora_b.T` (in
    w's shape and dtype, computed in float32 at full precision), and the adapters
    removed: the tree of the model without LoRA that computes the same function. Stacked
    (repeated-layer) leaves [L, ...] merge layer by layer. numpy stays numpy."""
    if not isinstance(params, dict):
        return params
    if "lora_a" not in params:
        return {k: merge_adapters(v) for k, v in params.items()}
    w, a, b = params["w"], params["lora_a"], params["lora_b"]
    delta = jnp.einsum("...ir,...or->...io", a, b, precision=jax.lax.Precision.HIGHEST,
                       preferred_element_type=jnp.float32)
    if isinstance(w, np.ndarray):
        merged = (w.astype(np.float32) + np.asarray(delta).reshape(w.shape)).astype(w.dtype)
    else:
        merged = (w.astype(jnp.float32) + delta.reshape(w.shape)).astype(w.dtype)
    return {**{k: v for k, v in params.items() if k not in ADAPTER_NAMES}, "w": merged}
