"""Pax checkpoints on disk, written the way paxml 1.4.0 writes them (paxml/checkpoints.py with
CheckpointType.GDA, checkpoint_managers.py, checkpoint_metadata.py; orbax-checkpoint 0.5.9
and tensorstore underneath), for tests of paxloom/runner/state/pax_format.py. paxml cannot be
installed next to Paxloom (it pins lingvo 0.12.7 and tensorflow 2.9, which have no wheels for
this Python, and jax 0.4.26), so the files are written here with tensorstore. In a separate
environment (paxml 1.4.0 without its dependencies, on its pinned jax, orbax and tensorstore)
paxml's restore_checkpoint read these files back exactly, and its save_checkpoint wrote the
same file tree (test_paxmls_own_checkpoint_reads_like_the_fixture repeats the comparison when
PAXML_PYTHON names such an environment):

    <job>/checkpoints/checkpoint_00000100/
      metadata/metadata     {"version": 1.1 | 1.2, "train_state_metadata": {"mdl_vars": ...}}
      state/_sharding       {base64(name): sharding JSON}
      state/<name>/         one zarr v2 array per TrainState leaf (zstd level 1, one chunk
                            per array, as one process writes it), named by its path:
                            mdl_vars.params.lm..., opt_states_0.mu.lm..., step
      state/manifest.ocdbt  instead, with --tensorstore_use_ocdbt: one OCDBT store, d/
      commit_success.txt    only on GCS (and in copies of a bucket's directory)

Parameters are given as Pax's (praxis's) nested dict, e.g. {"lm": {"final_ln": {"scale":
...}}}, as saxml's convert_llama_ckpt.py builds it.
"""

import base64
import json
import os

import msgpack
import numpy as np
import tensorstore as ts

# numpy dtype name -> zarr v2 dtype string, as tensorstore (and so orbax) writes it.
_ZARR_DTYPES = {"float32": "<f4", "float16": "<f2", "bfloat16": "bfloat16", "int32": "<i4"}


def flatten(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """Pax's parameter names: nested keys joined with '.' ("lm.final_ln.scale")."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _metadata(params: dict) -> dict:
    """paxml's checkpoint_metadata.ArrayMetadata.to_dict for every parameter."""
    if isinstance(params, dict):
        return {key: _metadata(value) for key, value in params.items()}
    return {"_array_metadata_tag": True, "dtype": str(params.dtype),
            "is_optax_masked_node": False, "unpadded_shape": list(params.shape)}


def _write_array(kvstore: dict, array: np.ndarray) -> None:
    spec = {
        "driver": "zarr",
        "kvstore": kvstore,
        "metadata": {
            "shape": list(array.shape),
            "chunks": list(array.shape) or [],
            "dtype": _ZARR_DTYPES[str(array.dtype)],
            "compressor": {"id": "zstd", "level": 1},
            "dimension_separator": ".",
        },
    }
    store = ts.open(spec, create=True, open=True).result()
    store.write(array).result()


def write_pax_checkpoint(directory, params: dict, *, step: int = 100,
                         dtype=np.float32, ocdbt: bool = False, commit_file: bool = False,
                         pad: dict[str, int] | None = None) -> str:
    """A job directory's checkpoints/checkpoint_<step>/ as paxml saves a TrainState whose
    mdl_vars are {"params": params} (cast to `dtype`) with Adam moments beside them; returns
    the step directory. `pad` {Pax name: n}: that parameter's last axis is saved n longer
    (garbage), its true shape in the metadata, as paxml saves a parameter padded to split
    evenly over a mesh (train_state_unpadded_shape_dtype_struct)."""
    import ml_dtypes  # bfloat16 for numpy

    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    params = _cast(params, dtype)
    metadata = _metadata(params)
    for name, extra in (pad or {}).items():
        *parents, last = name.split(".")
        node = params
        for key in parents:
            node = node[key]
        widths = [(0, 0)] * (node[last].ndim - 1) + [(0, extra)]
        node[last] = np.pad(node[last], widths, constant_values=7)
    step_dir = os.path.join(os.fspath(directory), "checkpoints", f"checkpoint_{step:08d}")
    state_dir = os.path.join(step_dir, "state")
    os.makedirs(state_dir)
    os.makedirs(os.path.join(step_dir, "metadata"))
    with open(os.path.join(step_dir, "metadata", "metadata"), "w") as f:
        json.dump({"version": 1.2 if ocdbt else 1.1,
                   "train_state_metadata": {"mdl_vars": {"params": metadata}}}, f)

    # (key path, array) of every TrainState leaf. Adam's moments (opt_states, a list) are
    # there for the reader never to open: they hold another shape, so reading one instead
    # of a parameter fails loudly.
    leaves = [(("step",), np.array(step, np.int32))]
    leaves += [(("mdl_vars", "params", *k.split(".")), v) for k, v in flatten(params).items()]
    leaves.append((("opt_states", 0, "count"), np.array(step, np.int32)))
    leaves += [(("opt_states", 0, moment, *k.split(".")), np.zeros((1,), np.float32))
               for moment in ("mu", "nu") for k in flatten(params)]
    arrays = {}
    for keys, array in leaves:
        # paxml names an array itself ('_' before a list index) unless orbax does (OCDBT).
        name = ".".join(map(str, keys)) if ocdbt else _pax_name(keys)
        arrays[name] = array
        if ocdbt:
            kvstore = {"driver": "ocdbt", "base": f"file://{state_dir}", "path": f"{name}/"}
        else:
            kvstore = {"driver": "file", "path": os.path.join(state_dir, name)}
        _write_array(kvstore, array)
    if ocdbt:  # orbax restores an OCDBT checkpoint's tree from these two files
        with open(os.path.join(state_dir, "_METADATA"), "w") as f:
            json.dump(_tree_metadata([keys for keys, _ in leaves]), f)
        with open(os.path.join(state_dir, "checkpoint"), "wb") as f:
            f.write(msgpack.packb(_aggregate([keys for keys, _ in leaves])))
    sharding = json.dumps({"sharding_type": "SingleDeviceSharding", "device_str": "TFRT_CPU_0"})
    with open(os.path.join(state_dir, "_sharding"), "w") as f:
        json.dump({base64.urlsafe_b64encode(name.encode()).decode(): sharding
                   for name in arrays}, f)
    if commit_file:  # orbax on GCS: the step and each item get one, last
        for where in (step_dir, state_dir, os.path.join(step_dir, "metadata")):
            with open(os.path.join(where, "commit_success.txt"), "w") as f:
                f.write(f"Checkpoint commit was successful to {where}")
    return step_dir


def _pax_name(keys: tuple) -> str:
    """paxml's _extract_nested_prefix_names: '.' between dict keys, '_' before list indices."""
    name = str(keys[0])
    for key in keys[1:]:
        name += f"_{key}" if isinstance(key, int) else f".{key}"
    return name


def _tree_metadata(paths: list[tuple]) -> dict:
    """orbax 0.5.9's _METADATA of an OCDBT PyTree save (key_type 1: a list index, 2: a dict
    key); TrainState's empty extra_state is recorded as skipped."""

    def entry(keys, value_type="jax.Array", skip=False):
        return {"key_metadata": [{"key": str(k), "key_type": 1 if isinstance(k, int) else 2}
                                 for k in keys],
                "value_metadata": {"value_type": value_type, "skip_deserialize": skip}}

    tree = {str(tuple(map(str, keys))): entry(keys) for keys in paths}
    tree["('extra_state',)"] = entry(("extra_state",), "None", True)
    return {"tree_metadata": tree, "use_zarr3": False}


def _aggregate(paths: list[tuple]):
    """orbax's msgpack aggregate file: the tree, each array a 'PLACEHOLDER://name'."""
    tree: dict = {"extra_state": None}
    for keys in paths:
        node = tree
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = "PLACEHOLDER://" + ".".join(map(str, keys))
    tree["opt_states"] = [tree["opt_states"][0]]  # a list in the TrainState
    return tree


def _cast(tree: dict, dtype) -> dict:
    return {k: _cast(v, dtype) if isinstance(v, dict) else np.asarray(v).astype(dtype)
            for k, v in tree.items()}


def stack_layers(transformer: dict, num_layers: int) -> dict:
    """Per-layer `x_layers_i` subtrees as one StackedTransformerRepeated subtree
    (repeat/sub/x_layers_0, every leaf [L, ...]), as Pax's USE_REPEATED_LAYER stores them."""
    layers = [transformer[f"x_layers_{i}"] for i in range(num_layers)]

    def stack(nodes):
        if isinstance(nodes[0], dict):
            return {k: stack([n[k] for n in nodes]) for k in nodes[0]}
        return np.stack(nodes)

    return {"repeat": {"sub": {"x_layers_0": stack(layers)}}}
