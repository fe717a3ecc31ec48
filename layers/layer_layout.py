"""Where each decoder layer's parameters sit in the layer stack's parameter tree.

praxis stores the same L transformer layers in several layouts (`params['lm']['transformer']`):

    plain       StackedTransformer              x_layers_{i}/...                    i < L
    repeated    StackedTransformerRepeated      repeat/sub/x_layers_0/...           [L, ...]
                a block of N layers per repeat: repeat/sub/x_layers_{j}/...         [L/N, ...]
    pipelined   PipelinedTransformer, stage body plain:
                                                pipeline/body/x_layers_{i}/...      [S, ...]
                stage body repeated:            pipeline/body/repeat/sub/x_layers_0 [S, K, ...]
                circular (circular_repeat R > 1) adds a leading [R] before [S]:
                                                pipeline/body/x_layers_{i}/...      [R, S, ...]
                                                pipeline/body/repeat/sub/x_layers_0 [R, S, K, ...]

with K = L / (R * S) layers per stage body (i < K when the body is plain). Layer
`r*S*K + s*K + i` sits at repeat r, stage s, body slot i: a microbatch runs stage 0..S-1
with repeat 0, then every stage again with repeat 1, and so on. A repeated body whose
scanned block holds N layers (layers/moe.py's mixture every Nth layer: the block's layers
differ) stores body slot i at x_layers_{i % N}, index i // N. This order was measured,
not read off praxis: tests/test_layer_layout.py checks that a pipelined model given a
plain model's layers in this order computes the plain model's loss.

`StackLayout` names a layout; it comes from a model config (`of_model`) or from a flat
{path: shape} of parameters (`from_shapes`: a checkpoint's metadata, without its
experiment). `to_layers` / `from_layers` convert between a stack's tree and a list of
per-layer trees; they work on numpy arrays, jax arrays (also traced) and shape structs
(jax.ShapeDtypeStruct, orbax's array metadata: anything with .shape and .dtype), and keep
optax's MaskedNode (an optimizer state that holds nothing for a frozen parameter).
"""

import dataclasses
from collections.abc import Mapping

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
from praxis.layers import transformers

STACK_PATH = ("lm", "transformer")  # where the stack sits in a LanguageModel's params
_REPEAT = ("repeat", "sub")  # a repeated stack's block: x_layers_{j} below it
_PIPELINE = ("pipeline", "body")


class LayoutMismatch(ValueError):
    """A parameter tree that is not in the layout it was said to be in."""


@dataclasses.dataclass(frozen=True)
class StackLayout:
    num_layers: int
    repeated: bool = False  # layers stacked on a leading axis (StackedTransformerRepeated)
    stages: int | None = None  # pipeline stages; None: not pipelined
    circular_repeat: int = 1  # > 1 only when pipelined
    block: int = 1  # layers in one scanned block of a repeated stack (> 1 only when repeated)

    def __post_init__(self):
        units = (self.stages or 1) * self.circular_repeat
        if self.num_layers < 1 or self.num_layers % units:
            raise LayoutMismatch(f"{self.num_layers} layers do not split into "
                                 f"{self.stages} stages x {self.circular_repeat} repeats")
        if self.stages is None and self.circular_repeat != 1:
            raise LayoutMismatch("a circular repeat without pipeline stages")
        if self.block < 1 or (self.block > 1 and not self.repeated) or (
                self.num_layers // units) % self.block:
            raise LayoutMismatch(f"{self.num_layers // units} layers per stage do not split "
                                 f"into repeated blocks of {self.block}")

    @property
    def pipelined(self) -> bool:
        return self.stages is not None

    @property
    def per_stage(self) -> int:
        """K: layers in one stage body (all L when not pipelined)."""
        return self.num_layers // ((self.stages or 1) * self.circular_repeat)

    @property
    def lead_shape(self) -> tuple[int, ...]:
        """The leading axes every stored leaf has before the per-layer shape."""
        return (((self.circular_repeat,) if self.circular_repeat > 1 else ())
                + ((self.stages,) if self.pipelined else ())
                + ((self.per_stage // self.block,) if self.repeated else ()))

    def body_paths(self) -> list[tuple[str, ...]]:
        """The subtrees of the stack that hold layers, each with lead_shape leading axes."""
        prefix = _PIPELINE if self.pipelined else ()
        if self.repeated:
            return [prefix + _REPEAT + (f"x_layers_{j}",) for j in range(self.block)]
        return [prefix + (f"x_layers_{i}",) for i in range(self.per_stage)]

    def locate(self, layer: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """(subtree path, index into its leading axes) of layer `layer` (0 = next to the
        embedding)."""
        k, s = self.per_stage, self.stages or 1
        r, rest = divmod(layer, s * k)
        stage, i = divmod(rest, k)
        index = (((r,) if self.circular_repeat > 1 else ())
                 + ((stage,) if self.pipelined else ())
                 + ((i // self.block,) if self.repeated else ()))
        prefix = _PIPELINE if self.pipelined else ()
        slot = (_REPEAT + (f"x_layers_{i % self.block}",)) if self.repeated else (
            f"x_layers_{i}",)
        return prefix + slot, index

    def __str__(self) -> str:
        """'4 layers', '4 repeated layers', '4 layers as 2 stages x 2', '8 layers as 2
        circular repeats x 2 stages x 2 repeated', '4 repeated layers in blocks of 2'."""
        blocks = f" in blocks of {self.block}" if self.block > 1 else ""
        if not self.pipelined:
            return f"{self.num_layers} {'repeated ' if self.repeated else ''}layers{blocks}"
        parts = ([f"{self.circular_repeat} circular repeats"] if self.circular_repeat > 1
                 else []) + [f"{self.stages} stages", str(self.per_stage)]
        return (f"{self.num_layers} layers as {' x '.join(parts)}"
                + (" repeated" if self.repeated else "") + blocks)



# ----- a layout from a config or from shapes ---------------------------------------------


def of_stack(stack) -> StackLayout:
    """The layout of a layer stack config (StackedTransformer, StackedTransformerRepeated,
    or a PipelinedTransformer around either)."""
    cls = fdl.get_callable(stack)
    if issubclass(cls, transformers.PipelinedTransformer):
        body = of_stack(stack.pipeline_stage)
        if body.pipelined:
            raise LayoutMismatch("a pipeline inside a pipeline stage")
        stages, repeat = int(stack.num_pipeline_stages), int(stack.circular_repeat)
        return StackLayout(body.num_layers * stages * repeat, body.repeated, stages, repeat,
                           body.block)
    if issubclass(cls, transformers.StackedTransformerRepeated):
        block = int(stack.block.num_layers)
        return StackLayout(int(stack.x_times) * block, repeated=True, block=block)
    if issubclass(cls, transformers.StackedTransformer):
        return StackLayout(int(stack.num_layers))
    raise LayoutMismatch(f"the layer stack is {cls.__name__}")


def of_model(model) -> StackLayout:
    """The layout of a praxis LanguageModel config's layer stack."""
    return of_stack(model.lm_tpl.stacked_transformer_tpl)


def from_shapes(shapes: Mapping[str, tuple], prefix: str = "/".join(STACK_PATH)
                ) -> StackLayout | None:
    """The layout of the stack under `prefix` in a flat {'lm/transformer/...': shape} (a
    checkpoint's metadata; values may be tuples or have .shape); None when no layout
    explains those paths. The leading axes are those of the per-layer leaves of lowest
    rank (a norm's scale, [D]) beyond their one axis."""
    prefix = prefix.rstrip("/") + "/"
    stack = {k[len(prefix):]: tuple(getattr(v, "shape", v)) for k, v in shapes.items()
             if k.startswith(prefix)}
    if not stack:
        return None
    pipelined = all(k.startswith("pipeline/body/") for k in stack)
    body = {k[len("pipeline/body/"):]: v for k, v in stack.items()} if pipelined else stack
    repeat = "/".join(_REPEAT) + "/"
    repeated = all(k.startswith(repeat) for k in body)
    if repeated:
        body = {k[len(repeat):]: v for k, v in body.items()}
    names = {k.split("/", 1)[0] for k in body}
    slots = len(names)  # plain: layers per stage; repeated: layers per scanned block
    if names != {f"x_layers_{i}" for i in range(slots)}:
        return None
    leading = min(len(shape) for shape in body.values()) - 1
    lead = next(shape[:leading] for shape in body.values() if len(shape) == leading + 1)
    if any(shape[:leading] != lead for shape in body.values()):
        return None
    expected = int(pipelined) + int(repeated)
    if leading == expected:
        circular = 1
    elif pipelined and leading == expected + 1:
        circular = lead[0]
    else:
        return None
    stages = lead[int(circular > 1)] if pipelined else None
    per_stage = lead[-1] * slots if repeated else slots
    try:
        return StackLayout(per_stage * (stages or 1) * circular, repeated, stages, circular,
                           slots if repeated else 1)
    except LayoutMismatch:
        return None


# ----- converting trees -----------------------------------------------------------------


def _get(tree, path: tuple[str, ...], where: str):
    for key in path:
        if not isinstance(tree, Mapping) or key not in tree:
            raise LayoutMismatch(f"{where} has no {'/'.join(path)}")
        tree = tree[key]
    return tree


def _is_shape_struct(leaf) -> bool:
    return not isinstance(leaf, (np.ndarray, jax.Array, np.generic)) and hasattr(
        leaf, "shape") and hasattr(leaf, "dtype")


def _take(leaf, index: tuple[int, ...], lead: tuple[int, ...]):
    if tuple(leaf.shape[:len(lead)]) != lead:
        raise LayoutMismatch(f"a leaf of shape {tuple(leaf.shape)} lacks leading axes {lead}")
    if _is_shape_struct(leaf):
        return jax.ShapeDtypeStruct(tuple(leaf.shape[len(index):]), leaf.dtype)
    return leaf[index] if index else leaf


def _stack(leaves: list, lead: tuple[int, ...]):
    first = leaves[0]
    if _is_shape_struct(first):
        return jax.ShapeDtypeStruct(lead + tuple(first.shape), first.dtype)
    if not lead:
        return first
    if all(isinstance(leaf, (np.ndarray, np.generic)) for leaf in leaves):
        return np.stack(leaves).reshape(lead + np.shape(first))
    return jnp.stack(leaves).reshape(lead + tuple(first.shape))


def to_layers(stack, layout: StackLayout) -> list:
    """The per-layer trees of a stack's tree (params['lm']['transformer'], or an optimizer
    moment of the same shape) stored in `layout`, in layer order."""
    lead = layout.lead_shape
    paths = layout.body_paths()
    body = _get(stack, _PIPELINE, "the stack") if layout.pipelined else stack
    names = set(body) if isinstance(body, Mapping) else set()
    expected = {path[len(_PIPELINE) if layout.pipelined else 0] for path in paths}
    if names != expected or (layout.pipelined and set(stack) != {_PIPELINE[0]}):
        raise LayoutMismatch(f"the stack is not {layout}: it holds {sorted(names)[:3]}")
    if layout.repeated:  # the scanned block holds exactly the layout's layers
        block = _get(body, _REPEAT, "the stack")
        held = set(block) if isinstance(block, Mapping) else set()
        if held != {path[-1] for path in paths}:
            raise LayoutMismatch(f"the stack is not {layout}: its repeated block holds "
                                 f"{sorted(held)[:3]}")
    layers = []
    for layer in range(layout.num_layers):
        path, index = layout.locate(layer)
        sub = _get(stack, path, "the stack")
        layers.append(jax.tree_util.tree_map(lambda leaf, i=index: _take(leaf, i, lead), sub))
    return layers


def from_layers(layers: list, layout: StackLayout) -> dict:
    """The stack's tree in `layout` from per-layer trees (in layer order): the inverse of
    `to_layers`."""
    layers = list(layers)
    if len(layers) != layout.num_layers:
        raise LayoutMismatch(f"{len(layers)} layers for a stack of {layout}")
    lead = layout.lead_shape
    slots: dict[tuple, dict] = {}
    for layer, tree in enumerate(layers):
        path, index = layout.locate(layer)
        slots.setdefault(path, {})[index] = tree
    out: dict = {}
    for path, by_index in slots.items():
        ordered = [by_index[index] for index in np.ndindex(*lead)] if lead else [by_index[()]]
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = jax.tree_util.tree_map(lambda *leaves: _stack(list(leaves), lead),
                                                *ordered)
    return out


def relayout(stack, source: StackLayout, target: StackLayout) -> dict:
    """A stack's tree in `source` layout, laid out as `target` (the same layers)."""
    if source.num_layers != target.num_layers:
        raise LayoutMismatch(f"{source} cannot be laid out as {target}")
    if source == target:
        return stack
    return from_layers(to_layers(stack, source), target)


def _is_model_tree(node) -> bool:
    return (isinstance(node, Mapping) and isinstance(node.get(STACK_PATH[0]), Mapping)
            and STACK_PATH[1] in node[STACK_PATH[0]])


def relayout_tree(tree, source: StackLayout, target: StackLayout):
    """`tree` with every params-shaped subtree ({'lm': {'transformer': ..., ...}}: the
    parameters and each optimizer moment) relaid from `source` to `target`; the rest of
    the tree (steps, counts, MaskedNode) is kept."""

    def fix(node):
        if not _is_model_tree(node):
            return node
        lm = dict(node[STACK_PATH[0]])
        lm[STACK_PATH[1]] = relayout(lm[STACK_PATH[1]], source, target)
        return {**node, STACK_PATH[0]: lm}

    return jax.tree_util.tree_map(fix, tree, is_leaf=_is_model_tree)

