"""A trained model, ready for inference (--mode=decode, paxloom/tools/export_hf.py): its architecture,
its parameters restored from a checkpoint onto a mesh (no optimizer state is read), and
the tokenizer it was trained with.

Everything comes from the run's Fiddle graph (a core.spec.RunSpec config), never
from an experiment object: the model, the mesh, the model's sizes (`model_shape`), its
name and its tokenizer node. No data is read: only those nodes are built, so decoding a
model trained on The Pile needs no --data_dir.
"""

import copy
import dataclasses

import fiddle as fdl
import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from praxis import pax_fiddle
from praxis.layers import transformers

from layers import architecture
from paxloom.core.data import BATCH_DTYPES, Tokenizer
from paxloom.core.errors import UserError
from paxloom.core.log import log
from paxloom.runner.cluster import mesh as mesh_lib
from paxloom.runner.state import checkpoints, initial_weights
from paxloom.runner.state.train_state import make_init_fn, param_partition_specs


@dataclasses.dataclass
class InferenceModel:
    arch: architecture.Architecture
    params: dict  # the praxis parameter tree, laid out on `mesh`
    param_shardings: dict
    mesh: Mesh
    step: int
    checkpoint: str  # the restored checkpoint's path
    max_seq_len: int  # the context the model was trained with (model_shape.seq_len)
    tokenizer: Tokenizer | None  # None: the run reads token ids (synthetic data)
    # Compiled programs of this model, by input shapes and settings (paxloom/runner/inference/decode.py).
    programs: dict = dataclasses.field(default_factory=dict, repr=False)


def run_architecture(config: fdl.Config, what: str) -> architecture.Architecture:
    """The architecture of the run graph `config`'s model; UserError naming the run (its
    `name`) and `what` cannot run ("export") if the inference code cannot reproduce it.
    A pipelined model is described unpipelined, as `load` reads it."""
    try:
        return architecture.architecture_of(unpipelined(config.model))
    except architecture.UnsupportedModel as error:
        raise UserError(f"{what} cannot run {config.name}'s model: {error}") from None


def load(config: fdl.Config, job_log_dir: str, *, what: str,
         restore_checkpoint_dir: str | None = None, restore_checkpoint_step: int | None = None,
         devices=None) -> InferenceModel:
    """The model of the run graph `config` from the latest (or the chosen) checkpoint of
    job_log_dir (or of restore_checkpoint_dir), on the graph's mesh over `devices`
    (default: all). `what` names the caller in errors ("--mode=decode")."""
    arch = run_architecture(config, what)
    shape = pax_fiddle.build(config.model_shape)
    checkpoint_dir = checkpoints.job_checkpoint_dir(job_log_dir)
    source = checkpoints.restore_source(checkpoint_dir, restore_checkpoint_dir,
                                        restore_checkpoint_step, mode="eval")
    initial = (pax_fiddle.build(config.initial_weights)
               if source is None and config.initial_weights is not None else None)
    if source is None and initial is None:
        raise UserError(f"{what} needs a checkpoint, and {checkpoint_dir} has none; train "
                        f"first (e.g. make run), or set --fdl.CHECKPOINT_RESTORE_PATH to the "
                        f"starting weights (e.g. from tools.import_hf)")
    if initial is not None and initial.ignore_rules:
        raise UserError(f"{what}: CHECKPOINT_IGNORE_RULES leave parameters of the starting "
                        f"weights untrained, and {checkpoint_dir} has no checkpoint; train "
                        f"first")
    tokenizer = load_tokenizer(config)  # before the slow part
    model = pax_fiddle.build(unpipelined(config.model))
    mesh_spec = pax_fiddle.build(config.mesh)
    mesh = mesh_lib.create_mesh(mesh_spec.ici_mesh_shape, mesh_spec.dcn_mesh_shape,
                                devices=devices)
    abstract = abstract_params(model, mesh, shape.seq_len)
    if initial is not None:
        # No checkpoint of the job's own: the starting weights, every parameter read.
        log(f"{what}: {checkpoint_dir} has no checkpoint; reading the starting weights "
            f"{initial.path} (CHECKPOINT_RESTORE_PATH)")
        params = initial_weights.load(initial, abstract, abstract, unpipelined(config.model))
        step, path = 0, initial.path
    else:
        restored = checkpoints.restore(*source, {"params": abstract}, params_only=True)
        params, step, path = restored.state["params"], restored.step, restored.path
    return InferenceModel(
        arch=arch, params=params,
        param_shardings=jax.tree_util.tree_map(lambda a: a.sharding, abstract), mesh=mesh,
        step=step, checkpoint=path, max_seq_len=shape.seq_len, tokenizer=tokenizer)


def unpipelined(model: fdl.Config) -> fdl.Config:
    """A model config whose layer stack is a PipelinedTransformer, as the same layers in one
    stack (its stage's class, plain or repeated, holding every layer); other configs as they
    are. Inference runs the layers one after another anyway (layers/cached_lm.py): the
    parameters are read with no stage axis, relaid from a pipelined checkpoint by
    checkpoints.restore, and replicated over the mesh's stages, if it has any."""
    stack = model.lm_tpl.stacked_transformer_tpl
    if not issubclass(fdl.get_callable(stack), transformers.PipelinedTransformer):
        return model
    blocks = stack.num_pipeline_stages * stack.circular_repeat
    body = copy.deepcopy(stack.pipeline_stage)
    if issubclass(fdl.get_callable(body), transformers.StackedTransformerRepeated):
        body.x_times *= blocks
    else:
        body.num_layers *= blocks
    model = copy.deepcopy(model)
    model.lm_tpl.stacked_transformer_tpl = body
    return model


def abstract_params(model, mesh: Mesh, seq_len: int) -> dict:
    """ShapeDtypeStructs of the model's parameters, sharded on `mesh` as training shards them
    (praxis's annotations), for checkpoints.restore."""
    rows = mesh.shape["replica"] * mesh.shape["data"]  # a batch every data shard can split
    shapes = {k: jax.ShapeDtypeStruct((rows, seq_len), dtype) for k, dtype in BATCH_DTYPES.items()}
    with jax.set_mesh(mesh):
        specs = param_partition_specs(
            model, {k: np.zeros(s.shape, s.dtype) for k, s in shapes.items()}, mesh)
    # The train state's init with an optimizer that has no state: only the parameters.
    params = jax.eval_shape(make_init_fn(model, optax.identity(), shapes),
                            jax.random.key(0))["params"]
    return jax.tree_util.tree_map(
        lambda a, spec: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, spec)),
        params, specs)


def load_tokenizer(config: fdl.Config) -> Tokenizer | None:
    """The run graph's tokenizer node (`config.tokenizer`), built: exactly what training
    encoded with; None for a graph of token ids (synthetic data without --vocab_path)."""
    return None if config.tokenizer is None else pax_fiddle.build(config.tokenizer)
