"""GLaM (Du et al. 2022) on praxis's GShard layers, as Pax's GLaM GPU configs build it.

`glam_model` calls praxis's own `GlamUniTransformerLmHParams` with the arguments of
paxml's `GLaM126M64EBase.task()` (paxml/contrib/gpu/scripts_gpu/configs.py). What that
gives, per praxis's glam.py:
- decoder blocks of two layers, [MoE, dense]: the first layer's feed-forward is praxis's
  GShard TransformerFeedForwardMoe (top-2 gating with a capacity per routing group, the
  load-balancing aux loss), the second a gated-GELU feed-forward without biases;
- RMSNorm (praxis's epsilon 1e-6, scale applied directly), no biases in any projection,
  separate q/k/v projections, bucketed relative position biases instead of position
  embeddings (`RelativeBias`), GShard's initialisations;
- a tied GShard embedding/softmax (`GShardSharedEmbeddingSoftmax`: one-hot lookups,
  logits of the input scaled by 1/sqrt(model_dims), an optional z-loss on them).
The experts are left at TransformerFeedForwardMoe's defaults, as praxis's helper leaves
them: ReLU and not gated (only the dense layers get `use_gated_activation`).

praxis 1.4.0's helper always scans the blocks (StackedTransformerRepeated); paxml's head
passes `repeat=False` to the newer helper, which builds one StackedTransformer of all the
layers with a mixture in every other one starting at the first. `glam_model` builds that
itself from the same block template when `use_repeated_layer` is False.
"""

import fiddle as fdl
from praxis import base_layer, pax_fiddle
from praxis.layers import glam, transformers

from layers.stack import language_model, rematerialise
from paxloom.core.step_metrics import report_step_metric


class GShardFeedForward(transformers.TransformerFeedForwardMoe):
    """praxis's GShard mixture-of-experts layer, unchanged, whose routing figures (its own
    praxis summaries) are also reported as step metrics, under the dropless layer's names
    where they mean the same (layers/moe.py): the load-balancing loss (unweighted), the
    share of top-1 and top-2 assignments over capacity, dropped (their mean), and the share
    of tokens that reached no expert."""

    def __call__(self, *args, **kwargs):
        outputs = super().__call__(*args, **kwargs)

        def summary(name):
            name += "_scalar"  # praxis's suffix for a scalar summary
            if self.has_variable(base_layer.SUMMARIES, name):
                return self.get_variable(base_layer.SUMMARIES, name)
            return None  # summaries are not being collected (evaluation)

        over_1, over_2 = summary("over_capacity_1_ratio"), summary("over_capacity_2_ratio")
        if over_1 is not None:
            report_step_metric(self, "moe/dropped_fraction", (over_1 + over_2) / 2)
            report_step_metric(self, "moe/unrouted_fraction", summary("dispatch_0"))
            report_step_metric(self, "moe/load_balancing_loss",
                               summary("aux_moe_load_balance_loss")
                               / self.moe_load_balance_loss_weight)
        return outputs


def glam_model(
    *,
    num_layers: int,
    model_dims: int,
    hidden_dims: int,
    moe_hidden_dims: int,
    num_heads: int,
    dims_per_head: int,
    vocab_size: int,
    num_experts: int,
    num_groups: int,
    capacity_factor: float,
    moe_load_balance_loss_weight: float,
    z_loss_weight: float,
    use_repeated_layer: bool,
    checkpoint_policy_name: str,
    packed_input: bool,
    fprop_dtype: str,
    init_std: float,
    dropout: dict | None = None,
) -> pax_fiddle.Config:
    """The unsharded praxis LanguageModel config of a GLaM decoder (module docstring).

    `num_groups`: the routing groups the tokens of a batch are split into, each with its
    own expert capacity (Pax: the product of the mesh's data-parallel axes).
    `moe_load_balance_loss_weight`: the weight of each mixture layer's aux loss.
    `init_std`: the model's default Gaussian init, as Pax sets it (every GLaM weight has
    GShard's own). Remat is layers/stack.py's `rematerialise`; `dropout` as there.
    """
    lm = glam.GlamUniTransformerLmHParams(
        name="glam_lm", vocab_size=vocab_size, num_transformer_layers=num_layers, moe=True,
        model_dim=model_dims, ff_dim=hidden_dims, moe_hidden_dim=moe_hidden_dims,
        attention_num_heads=num_heads, attention_key_value_dim=dims_per_head,
        attention_extra_logit=0.0,
        use_tgt_labels_size_as_loss_denominator=True,
        moe_load_balance_loss_weight=moe_load_balance_loss_weight,
        z_loss_weight=z_loss_weight,
        moe_gating_func="top2",
        moe_gating_embedding_level="token",
        c_dim=None,  # from capacity_factor and the group size
        capacity_factor=capacity_factor,
        e_dim=num_experts,
        num_groups=num_groups,
        use_gated_activation=True,
    )
    lm.packed_input = packed_input
    fdl.update_callable(lm.stacked_transformer_tpl.block.moe_layer_tpl, GShardFeedForward)
    block = lm.stacked_transformer_tpl.block  # [MoE, dense]
    block.set(**(dropout or {}))
    if not use_repeated_layer:  # praxis head's glam.py with repeat=False
        block.set(num_layers=num_layers, moe_layers=list(range(0, num_layers, 2)))
        lm.stacked_transformer_tpl = block
    rematerialise(lm.stacked_transformer_tpl, checkpoint_policy_name)
    return language_model(lm, fprop_dtype=fprop_dtype, init_std=init_std)
