"""Checkpoints that paxml wrote (Pax's GPT and LLaMA runs, saxml's converted LLaMA weights),
read into a Paxloom model's parameter layout.

What paxml writes (paxml/checkpoints.py, checkpoint_paths.py, checkpoint_managers.py): a
job's `checkpoints/` holds one directory per step, `checkpoint_%08d`. Pax's GPU runs use
pjit, so the type is GDA: an orbax CheckpointManager with two items,

    checkpoint_00012000/
      metadata/metadata   JSON {"version": 1.1 (1.2 with OCDBT), "train_state_metadata": ...}
      state/              the TrainState, one tensorstore zarr array per leaf, named by its
                          path with '.' between keys and '_' before a list index:
                          mdl_vars.params.lm.transformer.x_layers_0.ff_layer.layer_norm.scale,
                          opt_states_0...., step
      commit_success.txt  on GCS only, where a save cannot end in a rename

With --tensorstore_use_ocdbt, `state/` is one OCDBT key-value store (manifest.ocdbt, d/)
holding the same names as keys; version-0 checkpoints have the arrays directly in the step
directory. Only `mdl_vars.params.*` is read, one array at a time; the optimizer state is
never opened.

Pax's parameter tree is praxis's, as Paxloom's is (a layer template's `name=` does not
rename anything: praxis's create_child sets the child's name). What differs, and is
converted to the target's layout (layers/architecture.py's Architecture, and the target's
abstract tree `like`):
- repeated layers (`lm.transformer.repeat.sub.x_layers_0.*`, a leading [L] axis) or one
  subtree per layer (`x_layers_i`), either way round;
- norm scales: Pax keeps praxis's defaults, LayerNorm stores `scale - 1` (the GPT) and
  RmsNorm the multiplier itself (BaseLLaMA sets direct_scale=True);
- RoPE: Pax's LLaMA uses saxml's LLaMARotaryEmbedding, which rotates the interleaved
  pairs (2i, 2i+1) of each head (Meta's original layout, which saxml's converter keeps),
  while praxis's RotaryPositionalEmbedding rotates (i, i + H/2) with the same
  frequencies; the query and key heads' dimensions are permuted to match (attention
  logits are sums over those dimensions, so the model's outputs are unchanged);
- q/k/v: Pax's LLaMA7B/13B and GPT combine them ([3, D, N, H]) as Paxloom's multi-head
  models do, LLaMA70B's grouped-query attention keeps query/key/value as Paxloom's does;
  separate ones with as many key/value heads as query heads are combined.
"""

import json
import os
import re

import numpy as np
import tensorstore as ts

from layers import lora
from layers.architecture import Architecture, Norm
from paxloom.core.errors import UserError
from paxloom.core.log import log
from paxloom.runner.state.checkpoints import flat_params

_STEP_NAME = re.compile(r"checkpoint_(\d+)")  # tmp saves are named differently
_COMMIT_FILE = "commit_success.txt"
_PARAMS = "mdl_vars.params."
# A zarr array's metadata file -> the tensorstore driver that reads it.
_ZARR_DRIVERS = {".zarray": "zarr", "zarr.json": "zarr3"}
# Whether Pax stores the multiplier itself, by norm kind: praxis's defaults, which the Pax
# GPT (LayerNorm) keeps and Pax's LLaMA (RmsNorm, direct_scale=True) states.
_PAX_DIRECT_SCALE = {"layer_norm": False, "rms_norm": True}
ROPE_PAIRS = ("interleaved", "halves")

_REPEATED = "lm/transformer/repeat/sub/x_layers_0/"
_PER_LAYER = re.compile(r"lm/transformer/x_layers_(\d+)/(.+)")
_QKV = ("query", "key", "value")


# ----- finding the step -----------------------------------------------------------------


def _step_dirs(directory: str) -> list[tuple[int, str]]:
    """(step, path) of the Pax step directories in `directory`, oldest first."""
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        match = _STEP_NAME.fullmatch(name)
        if match and os.path.isdir(os.path.join(directory, name)):
            found.append((int(match.group(1)), os.path.join(directory, name)))
    return sorted(found)


def _step_candidates(path: str) -> list[tuple[int, str]]:
    """The step directories `path` names: itself, or those in it or in its checkpoints/."""
    path = os.path.abspath(path)
    match = _STEP_NAME.fullmatch(os.path.basename(path))
    if match and os.path.isdir(path):
        return [(int(match.group(1)), path)]
    return _step_dirs(path) or _step_dirs(os.path.join(path, "checkpoints"))


def is_pax_checkpoint(path) -> bool:
    """Whether `path` is a Pax step directory (checkpoint_XXXXXXXX/), or a job or
    checkpoints/ directory holding some."""
    return bool(_step_candidates(os.fspath(path)))


def _array_dir(step_dir: str) -> str:
    state = os.path.join(step_dir, "state")
    return state if os.path.isdir(state) else step_dir  # version 0: no items


def _has_params(step_dir: str) -> bool:
    directory = _array_dir(step_dir)
    return (os.path.exists(os.path.join(directory, "manifest.ocdbt"))
            or any(name.startswith(_PARAMS) for name in os.listdir(directory)))


def _complete(step_dir: str, commit_files: bool) -> bool:
    # Orbax finishes a local save by renaming its tmp directory, so a step directory's name
    # means it is complete; on GCS it writes commit_success.txt last instead, so in a copy
    # of a bucket's directory a step without that file was cut short.
    if commit_files and not os.path.exists(os.path.join(step_dir, _COMMIT_FILE)):
        return False
    return _has_params(step_dir)


def step_directory(path, quiet: bool = False) -> str:
    """The step directory `path` names, or the latest complete one in it (or in its
    checkpoints/), logged unless `quiet`; UserError when there is none."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise UserError(f"{path}: no such file or directory; give a Pax checkpoint step "
                        f"directory (checkpoint_XXXXXXXX/) or the job or checkpoints/ "
                        f"directory that holds them")
    steps = _step_candidates(path)
    if not steps:
        raise UserError(f"{path} is not a Pax checkpoint: it is not a checkpoint_XXXXXXXX/ "
                        f"step directory and holds none (nor does its checkpoints/); give one "
                        f"of those")
    commit_files = any(os.path.exists(os.path.join(d, _COMMIT_FILE))
                       for d in [p for _, p in _step_dirs(os.path.dirname(steps[-1][1]))])
    complete = [(step, d) for step, d in steps if _complete(d, commit_files)]
    if not complete:
        why = (f"no {_COMMIT_FILE}, or no mdl_vars.params.* arrays" if commit_files
               else "no mdl_vars.params.* arrays")
        if any(os.path.isfile(os.path.join(d, "checkpoint")) for _, d in steps):
            why = "a Flax msgpack file (a pmap run's checkpoint), which is not read"
        raise UserError(f"{path}: no complete Pax checkpoint step ({why} in "
                        f"{os.path.basename(steps[-1][1])}); wait for the save to finish, or "
                        f"give a step directory that paxml finished writing (with tensorstore, "
                        f"as pjit runs save)")
    step, step_dir = complete[-1]
    skipped = [s for s, _ in steps if s > step]
    if not quiet:
        log(f"Pax checkpoint: step {step} ({step_dir})"
            + (f"; skipped incomplete step(s) {skipped}" if skipped else ""))
    return step_dir


# ----- the arrays -----------------------------------------------------------------------


class _Arrays:
    """The `mdl_vars.params.*` arrays of one step: per-array zarr directories, or keys of
    one OCDBT store. Opening reads only metadata; `read` reads one array."""

    def __init__(self, step_dir: str):
        self.directory = _array_dir(step_dir)
        self.ocdbt = os.path.exists(os.path.join(self.directory, "manifest.ocdbt"))
        self.drivers = self._list()
        self.unpadded = _unpadded_shapes(step_dir)
        self._open: dict[str, ts.TensorStore] = {}

    def _list(self) -> dict[str, str]:
        if self.ocdbt:
            store = ts.KvStore.open(self._ocdbt_spec()).result()
            # '/' follows '.': the range is exactly the keys that start with _PARAMS.
            keys = store.list(ts.KvStore.KeyRange(inclusive_min=_PARAMS,
                                                  exclusive_max=_PARAMS[:-1] + "/")).result()
            files = [key.decode().rpartition("/")[::2] for key in keys]
        else:
            files = [(name, leaf) for name in os.listdir(self.directory)
                     if name.startswith(_PARAMS) for leaf in _ZARR_DRIVERS
                     if os.path.exists(os.path.join(self.directory, name, leaf))]
        return {name[len(_PARAMS):]: _ZARR_DRIVERS[leaf] for name, leaf in files
                if leaf in _ZARR_DRIVERS}

    def _ocdbt_spec(self) -> dict:
        return {"driver": "ocdbt", "base": f"file://{self.directory}"}

    def file(self, name: str) -> str:
        """Where array `name` ("lm.final_ln.scale") is, for messages."""
        return os.path.join(self.directory, _PARAMS + name)

    def store(self, name: str) -> ts.TensorStore:
        if name not in self._open:
            kvstore = ({**self._ocdbt_spec(), "path": f"{_PARAMS}{name}/"} if self.ocdbt
                       else {"driver": "file", "path": self.file(name)})
            spec = {"driver": self.drivers[name], "kvstore": kvstore}
            try:
                self._open[name] = ts.open(spec, open=True, read=True).result()
            except ValueError as error:
                raise UserError(f"{self.file(name)}: cannot open the array "
                                f"({str(error).splitlines()[0]}); the checkpoint is damaged "
                                f"or incomplete") from None
        return self._open[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.unpadded.get(name) or tuple(self.store(name).shape)

    def read(self, name: str) -> np.ndarray:
        store = self.store(name)
        if name in self.unpadded:  # Pax padded it to split evenly over the mesh
            store = store[tuple(slice(0, n) for n in self.unpadded[name])]
        try:
            array = np.asarray(store.read().result(), np.float32)
        except ValueError as error:
            raise UserError(f"{self.file(name)}: cannot read the array "
                            f"({str(error).splitlines()[0]}); the checkpoint is damaged "
                            f"or incomplete") from None
        del self._open[name]  # nothing of it is needed again
        return array


def param_shapes(path, names) -> dict[str, tuple[int, ...]]:
    """{name: shape} of those of the parameters `names` outside the decoder layers
    ("lm/softmax/logits_ffn/linear/w") that the Pax checkpoint `path` holds (its metadata
    only, step_directory's step)."""
    arrays = _Arrays(step_directory(path, quiet=True))
    return {name: arrays.shape(_pax_name(name)) for name in names
            if _pax_name(name) in arrays.drivers}


def _unpadded_shapes(step_dir: str) -> dict[str, tuple[int, ...]]:
    """{name: shape} from metadata/metadata (version > 1): paxml saves arrays padded to split
    evenly over the mesh, and their true shapes there."""
    path = os.path.join(step_dir, "metadata", "metadata")
    try:
        with open(path) as f:
            tree = json.load(f).get("train_state_metadata", {}).get("mdl_vars", {})
    except (OSError, ValueError, AttributeError):
        return {}  # version 0 has none; the arrays' own shapes stand
    shapes = {}

    def walk(node, prefix: str) -> None:
        if not isinstance(node, dict):
            return
        if node.get("_array_metadata_tag") and node.get("unpadded_shape") is not None:
            shapes[prefix[len("params."):]] = tuple(node["unpadded_shape"])
            return
        for key, child in node.items():
            walk(child, f"{prefix}{key}.")

    walk(tree.get("params"), "params.")
    return {name.rstrip("."): shape for name, shape in shapes.items()}


# ----- the mapping ----------------------------------------------------------------------


class _Source:
    """The checkpoint's parameters with every per-layer leaf seen stacked over layers, [L, ...]
    (`layer_names`/`read_layers`) whether Pax stored it repeated or per layer."""

    def __init__(self, arrays: _Arrays):
        self.arrays = arrays
        names = arrays.drivers
        repeated = "lm.transformer.repeat.sub.x_layers_0."
        self.repeated = any(n.startswith(repeated) for n in names)
        per_layer = [re.match(r"lm\.transformer\.x_layers_(\d+)\.", n) for n in names]
        self.layer_ids = sorted({int(m.group(1)) for m in per_layer if m})
        if self.repeated and self.layer_ids:
            raise UserError(f"{arrays.directory}: the checkpoint has both repeated "
                            f"(lm.transformer.repeat...) and per-layer (x_layers_i) parameters; "
                            f"it is not one Pax transformer stack")
        self.repeated_prefix = repeated

    def num_layers(self) -> int | None:
        if self.repeated:
            shapes = [self.arrays.shape(n) for n in self.arrays.drivers
                      if n.startswith(self.repeated_prefix)]
            return shapes[0][0] if shapes and shapes[0] else None
        return len(self.layer_ids) if self.layer_ids else None

    def layer_names(self, rest: str, num_layers: int) -> list[str] | None:
        """The Pax names that hold within-layer leaf `rest` ("self_attention.post.w") for
        every layer; None if the checkpoint lacks it."""
        if self.repeated:
            names = [self.repeated_prefix + rest]
        else:
            names = [f"lm.transformer.x_layers_{i}.{rest}" for i in range(num_layers)]
        return names if all(n in self.arrays.drivers for n in names) else None

    def layers_shape(self, names: list[str]) -> tuple[int, ...]:
        if self.repeated:
            return self.arrays.shape(names[0])
        return (len(names),) + self.arrays.shape(names[0])

    def read_layers(self, names: list[str]) -> np.ndarray:
        if self.repeated:
            return self.arrays.read(names[0])
        return np.stack([self.arrays.read(n) for n in names])


def _pax_name(path: str) -> str:
    return path.replace("/", ".")


def _source_for(source: _Source, rest: str, num_layers: int):
    """How to read within-layer target leaf `rest` ("self_attention/post/w") stacked over
    layers: (Pax names, shape, reader), or None. A combined q/k/v projection is stacked
    from separate ones (Pax's MultiQueryDotProductAttention with as many key/value heads as
    query heads), since Paxloom's multi-head models have the combined one."""
    names = source.layer_names(_pax_name(rest), num_layers)
    if names is not None:
        return names, source.layers_shape(names), lambda: source.read_layers(names)
    parts = rest.split("/")
    if len(parts) == 3 and parts[:2] == ["self_attention", "combined_qkv"]:
        each = [source.layer_names(f"self_attention.{p}.{parts[2]}", num_layers) for p in _QKV]
        if all(n is not None for n in each):
            query, key = (source.layers_shape(n) for n in each[:2])
            if key != query:  # one projection can hold them only with as many k/v heads as q
                kv_heads = key[-2] if len(key) == len(query) else 1
                raise UserError(f"{source.arrays.file(each[1][0])}: shape "
                                f"{source.arrays.shape(each[1][0])}, {kv_heads} key/value "
                                f"heads (grouped-query attention), but this model has one "
                                f"combined q/k/v projection; set NUM_KV_HEADS={kv_heads}")
            return ([n for names in each for n in names], query[:1] + (3,) + query[1:],
                    lambda: np.stack([source.read_layers(n) for n in each], axis=1))
    return None


def _norm_of(path: str, arch: Architecture) -> Norm | None:
    if path == "lm/final_ln/scale":
        return arch.final_norm
    if path.endswith("ff_layer/layer_norm/scale"):
        return arch.mlp_norm
    if path.endswith("/layer_norm/scale"):
        return arch.attention_norm
    return None


def _convert_scale(scale: np.ndarray, norm: Norm) -> np.ndarray:
    """Pax's stored norm scale in the target's convention (praxis multiplies by `scale`
    with direct_scale, else by 1 + scale)."""
    multiplier = scale if _PAX_DIRECT_SCALE[norm.kind] else scale + 1
    return multiplier if norm.direct_scale else multiplier - 1


def _rope_permutation(head_dims: int) -> np.ndarray:
    """Head dimensions in praxis's order (i, i + H/2 rotate together) taken from the
    interleaved order (2i, 2i+1 rotate together) at the same frequency i."""
    return np.concatenate([np.arange(0, head_dims, 2), np.arange(1, head_dims, 2)])


def _unpair_rope(path: str, array: np.ndarray, arch: Architecture) -> np.ndarray:
    """Query and key weights (and biases) of `path`, stacked over layers, with each head's
    dimensions reordered from interleaved RoPE pairs to praxis's halves."""
    parts = path.split("/")
    if "self_attention" not in parts or parts[-1] not in ("w", "b"):
        return array
    projection = parts[-2]
    if projection not in ("combined_qkv", "query", "key"):
        return array
    perm = _rope_permutation(arch.dims_per_head)
    if projection == "combined_qkv":  # [L, 3, ...]: q and k only
        array[:, :2] = array[:, :2][..., perm]
        return array
    return array[..., perm]


def _plan(arrays: _Arrays, source: _Source, arch: Architecture, targets: dict) -> dict:
    """{group: (within-layer leaf or None, Pax names, reader)}, a group being a within-layer
    leaf ("ff_layer/layer_norm/scale", read stacked over layers) or a top-level parameter's
    path. Only metadata is read, so that a missing or mismatched parameter is reported
    before gigabytes are."""
    groups: dict[str, tuple] = {}
    for name, shape in targets.items():
        per_layer = _PER_LAYER.fullmatch(name)
        if name.startswith(_REPEATED):
            key, want = name[len(_REPEATED):], shape
        elif per_layer:
            key, want = per_layer.group(2), (arch.num_layers,) + shape
        else:
            key, want = None, shape
        group = name if key is None else key
        if group in groups:
            continue
        if key is None:
            pax = _pax_name(name)
            plan = ((([pax], arrays.shape(pax), lambda pax=pax: arrays.read(pax)))
                    if pax in arrays.drivers else None)
        else:
            pax = (source.repeated_prefix if source.repeated else "lm.transformer.x_layers_0."
                   ) + _pax_name(key)
            plan = _source_for(source, key, arch.num_layers)
        if plan is None:
            raise UserError(f"{arrays.file(pax)}: missing, and this model's {name} {shape} "
                            f"needs it; the Pax checkpoint is of another model family or "
                            f"layout: choose the experiment that matches it")
        names, saved, reader = plan
        if tuple(saved) != tuple(want):
            on_disk = arrays.shape(names[0])
            raise UserError(f"{arrays.file(names[0])}: shape {on_disk}, but this model's {name} "
                            f"is {shape}; set the experiment's shape hyperparameters "
                            f"(MODEL_DIMS, HIDDEN_DIMS, NUM_HEADS, NUM_KV_HEADS, DIMS_PER_HEAD, "
                            f"VOCAB_SIZE, MAX_SEQ_LEN) to the checkpoint's")
        groups[group] = (key, names, reader)
    return groups


def read_params(path, arch: Architecture, like: dict, *,
                rope_pairs: str = "interleaved") -> dict[str, np.ndarray]:
    """The model parameters of the Pax checkpoint `path` (a step directory, or the job or
    checkpoints/ directory whose latest complete step is read) as float32 arrays keyed by
    parameter path ("lm/transformer/x_layers_0/self_attention/combined_qkv/w"), laid out for
    the model `arch` whose abstract parameter tree is `like`: repeated or per-layer, norm
    scales in its convention, RoPE pairs in praxis's order. `like`'s LoRA adapters are left
    out.

    `rope_pairs` says which head dimensions the checkpoint's model rotated together:
    "interleaved" (saxml's LLaMARotaryEmbedding, which Pax's LLaMA configs use) or "halves"
    (praxis's own RotaryPositionalEmbedding, e.g. a Pax model with USE_ROTARY_POSITION_EMB).

    UserError, one line naming the file or parameter, when `path` is not a Pax checkpoint,
    has no complete step, lacks a parameter of the model, holds one in another shape, or
    holds parameters the model has no place for (another architecture)."""
    if rope_pairs not in ROPE_PAIRS:
        raise ValueError(f"rope_pairs={rope_pairs!r}; one of {ROPE_PAIRS}")
    step_dir = step_directory(path)
    arrays = _Arrays(step_dir)
    if not arrays.drivers:
        raise UserError(f"{arrays.directory}: no mdl_vars.params.* arrays; not a Pax "
                        f"checkpoint of a model's parameters")
    source = _Source(arrays)
    targets = {name: tuple(leaf.shape) for name, leaf in flat_params(like).items()
               if not lora.is_adapter(name)}
    saved_layers = source.num_layers()
    if saved_layers is not None and saved_layers != arch.num_layers:
        raise UserError(f"{arrays.directory}: the Pax checkpoint has {saved_layers} layers and "
                        f"this model {arch.num_layers}; set NUM_LAYERS={saved_layers}")
    groups = _plan(arrays, source, arch, targets)
    used = {n for _, names, _ in groups.values() for n in names}
    unused = sorted(n for n in arrays.drivers if n not in used and not lora.is_adapter(n))
    if unused:
        raise UserError(f"{arrays.file(unused[0])}"
                        + (f" (and {len(unused) - 1} more)" if len(unused) > 1 else "")
                        + ": the Pax checkpoint has parameters this model has no place for, "
                          "so it is of another architecture (biases, norms, attention); "
                          "choose the experiment that matches it")

    target_repeated = any(name.startswith(_REPEATED) for name in targets)
    unpair = arch.positions == "rotary" and rope_pairs == "interleaved"
    out: dict[str, np.ndarray] = {}
    for group, (key, _, reader) in groups.items():
        array = reader()  # [L, ...] when `key` is a within-layer leaf
        where = group if key is None else _REPEATED + key
        norm = _norm_of(where, arch)
        if norm is not None:
            array = _convert_scale(array, norm)
        if key is None:
            out[group] = array
            continue
        if unpair:
            array = _unpair_rope(where, array, arch)
        if target_repeated:
            out[where] = array
        else:
            for i in range(arch.num_layers):
                out[f"lm/transformer/x_layers_{i}/{key}"] = array[i]
    return out
