"""A trained model, ready for inference (--mode=decode, tools/export_hf.py): its architecture,
its parameters restored from a checkpoint onto a mesh (no optimizer state is read), and
the vocabulary it was trained with.

No data is read: only the model, the mesh and the vocabulary nodes of the experiment's
Fiddle graph are built, so decoding a model trained on The Pile needs no --data_dir.
"""

import dataclasses

import fiddle as fdl
import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from praxis import pax_fiddle

from layers import architecture
from runner.cluster import mesh as mesh_lib
from runner.core.errors import UserError
from runner.state import checkpoints
from runner.state.train_state import make_init_fn, param_partition_specs
from runner.training.trainer import BATCH_DTYPES
from tasks import datasets
from tasks.vocab import Vocabulary, check_vocab_size, load_vocabulary


@dataclasses.dataclass
class InferenceModel:
    arch: architecture.Architecture
    params: dict  # the praxis parameter tree, laid out on `mesh`
    param_shardings: dict
    mesh: Mesh
    step: int
    checkpoint: str  # the restored checkpoint's path
    max_seq_len: int  # the context the model was trained with (MAX_SEQ_LEN)
    vocab: Vocabulary | None  # None: the experiment reads token ids (synthetic data)
    # Compiled programs of this model, by input shapes and settings (runner/inference/decode.py).
    programs: dict = dataclasses.field(default_factory=dict, repr=False)


def describe(exp, config, what: str) -> architecture.Architecture:
    try:
        return architecture.describe(config.model)
    except architecture.UnsupportedModel as error:
        raise UserError(f"{what} cannot run {type(exp).__name__}'s model: {error}") from None


def load(exp, config: fdl.Config, job_log_dir: str, *, what: str,
         restore_checkpoint_dir: str | None = None, restore_checkpoint_step: int | None = None,
         vocab_path: str | None = None, devices=None) -> InferenceModel:
    """The model of experiment `exp` (its run graph `config`) from the latest (or the chosen)
    checkpoint of job_log_dir (or of restore_checkpoint_dir), on the graph's mesh over
    `devices` (default: all). `what` names the caller in errors ("--mode=decode")."""
    arch = describe(exp, config, what)
    checkpoint_dir = checkpoints.job_checkpoint_dir(job_log_dir)
    source = checkpoints.restore_source(checkpoint_dir, restore_checkpoint_dir,
                                        restore_checkpoint_step, mode="eval")
    if source is None:
        raise UserError(f"{what} needs a checkpoint, and {checkpoint_dir} has none; train "
                        f"first (e.g. make run)")
    vocab = vocabulary(config, vocab_path, exp.VOCAB_SIZE)  # before the slow part
    model = pax_fiddle.build(config.model)
    mesh_spec = pax_fiddle.build(config.mesh)
    mesh = mesh_lib.create_mesh(mesh_spec.ici_mesh_shape, mesh_spec.dcn_mesh_shape,
                                devices=devices)
    abstract = abstract_params(model, mesh, exp.MAX_SEQ_LEN)
    restored = checkpoints.restore(*source, {"params": abstract}, params_only=True)
    return InferenceModel(
        arch=arch, params=restored.state["params"],
        param_shardings=jax.tree_util.tree_map(lambda a: a.sharding, abstract), mesh=mesh,
        step=restored.step, checkpoint=restored.path, max_seq_len=exp.MAX_SEQ_LEN, vocab=vocab)


def abstract_params(model, mesh: Mesh, seq_len: int) -> dict:
    """ShapeDtypeStructs of the model's parameters, sharded on `mesh` as training shards them
    (praxis's annotations), for checkpoints.restore."""
    rows = mesh.shape["replica"] * mesh.shape["data"]  # a batch every data shard can split
    shapes = {k: jax.ShapeDtypeStruct((rows, seq_len), dtype) for k, dtype in BATCH_DTYPES.items()}
    with mesh:
        specs = param_partition_specs(
            model, {k: np.zeros(s.shape, s.dtype) for k, s in shapes.items()}, mesh)
    # The train state's init with an optimizer that has no state: only the parameters.
    params = jax.eval_shape(make_init_fn(model, optax.identity(), shapes),
                            jax.random.key(0))["params"]
    return jax.tree_util.tree_map(
        lambda a, spec: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, spec)),
        params, specs)


def vocabulary(config: fdl.Config, vocab_path: str | None, vocab_size: int) -> Vocabulary | None:
    """The vocabulary node of the run's graph, built (so exactly what training loaded);
    --vocab_path for an experiment without one (synthetic data); else None."""
    node = _find_node(config, datasets.vocabulary)
    if node is not None:
        return pax_fiddle.build(node)
    if vocab_path:
        vocab = load_vocabulary(vocab_path)
        check_vocab_size(vocab, vocab_size)
        return vocab
    return None


def _find_node(config: fdl.Buildable, fn) -> fdl.Buildable | None:
    """The first node of the graph that calls `fn`."""
    pending, seen = [config], set()
    while pending:
        value = pending.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, fdl.Buildable):
            if fdl.get_callable(value) is fn:
                return value
            pending.extend(value.__arguments__.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
        elif isinstance(value, dict):
            pending.extend(value.values())
    return None
