"""Step metrics: scalars a layer reports from inside the model, shown in the step log and
in TensorBoard beside the loss (a mixture-of-experts layer's router losses and load).

A layer calls `report_step_metric(self, "group/name", value)`; the value travels in
praxis's summaries collection (which praxis's scanned and pipelined stacks carry per
layer). The trainer reads them back with `collect`, averaged over every layer that
reported the name, and adds them to the step's metrics.
"""

import jax
import jax.numpy as jnp

# Marks a praxis summary as a step metric; praxis appends "_scalar" to a scalar's name.
_PREFIX = "step_metric:"
_SUFFIX = "_scalar"


def report_step_metric(layer, name: str, value) -> None:
    """Report the scalar `value` as the step metric `name` from the praxis `layer`."""
    layer.add_summary(_PREFIX + name, jnp.asarray(value, jnp.float32))


def collect(summaries) -> dict:
    """{name: mean over the layers that reported it} from a praxis summaries tree."""
    found: dict[str, list] = {}

    def visit(tree):
        for key, value in tree.items():
            if isinstance(value, dict) or hasattr(value, "items"):
                visit(value)
            elif isinstance(key, str) and key.startswith(_PREFIX):
                name = key[len(_PREFIX):]
                name = name[: -len(_SUFFIX)] if name.endswith(_SUFFIX) else name
                for leaf in jax.tree_util.tree_leaves(value):
                    found.setdefault(name, []).append(jnp.ravel(leaf).astype(jnp.float32))

    visit(summaries)
    return {name: jnp.mean(jnp.concatenate(values)) for name, values in sorted(found.items())}
