"""A new run's parameters from trained weights: CHECKPOINT_RESTORE_PATH, Pax's
`init_from_checkpoint_rules` with its `load_rules=[("(.*)", "{}")]`.

The path may be another Paxloom run (its job directory, its checkpoints/ directory, or
one step's directory), a Hugging Face model directory (config.json + safetensors,
paxloom/runner/state/hf_format.py) or a Pax checkpoint (checkpoint_XXXXXXXX/,
paxloom/runner/state/pax_format.py). Every parameter of this run's model is read from it, in
the layout of this run's mesh, except those an ignore rule matches: they keep their
fresh initialisation (LoRA adapters, a new output layer). Only parameters are read; the
optimizer starts fresh, at step 0.

Ignore rules are regexes matched, as Pax matches them, from the start of a parameter's
path in either spelling: Pax's `params/lm/transformer/x_layers_0/...` or Paxloom's
`lm/transformer/x_layers_0/...` (the path checkpoints, the planner and errors print).

Nothing here writes: the source is opened read-only, and the new run's checkpoints go to
its own job directory (paxloom/launch/job.py decides when a run starts from here: only
while that directory holds no checkpoint of its own).
"""

import os
import re

import jax
import numpy as np

from paxloom.core.errors import UserError
from paxloom.core.log import log
from paxloom.core.spec import InitialWeights
from paxloom.runner.state import checkpoints

FLAG = "CHECKPOINT_RESTORE_PATH"
# The parameters with a row per token id, by that axis: the input embedding of an untied
# model [V, D], the output layer [D, V]. A run that reads one has the source's VOCAB_SIZE.
_VOCAB_AXES = {"lm/embedding_lookup/emb_var": 0, "lm/softmax/logits_ffn/linear/w": 1}


def _compile(rules: list[str]) -> list[re.Pattern]:
    compiled = []
    for rule in rules:
        try:
            compiled.append(re.compile(rule))
        except re.error as error:
            raise UserError(f"CHECKPOINT_IGNORE_RULES: {rule!r} is not a regular expression "
                            f"({error})") from None
    return compiled


def _matches(rule: re.Pattern, name: str) -> bool:
    return bool(rule.match(name) or rule.match(f"params/{name}"))


def skip_rule(name: str) -> str:
    """The rule that skips exactly parameter `name`: the one errors suggest."""
    return f"^{re.escape(name)}$"


class _Source:
    """One checkpoint to read parameters from: its kind, where, and what it holds."""

    def __init__(self, path: str, model_config):
        self.path, self.model_config = path, model_config
        if not os.path.exists(path):
            raise UserError(f"{FLAG}={path}: no such file or directory; pass a run's "
                            f"job_log_dir, a checkpoint directory, a Hugging Face model "
                            f"directory or a Pax checkpoint")
        self.directory, self.step = _paxloom_checkpoint(path)
        self._read = None  # a Paxloom checkpoint is read by orbax
        if self.step is not None:
            self.kind = f"checkpoint step {self.step} of {self.directory}"
            return
        from paxloom.runner.state import hf_format, pax_format

        if hf_format.is_hf_model_dir(path):
            self.kind = f"Hugging Face model {path}"
            self._read = hf_format.read_params  # checks config.json against the model first
        elif pax_format.is_pax_checkpoint(path):
            self.kind = f"Pax checkpoint {path}"
            self._read = pax_format.read_params
        else:
            raise UserError(f"{FLAG}={path} is neither a Paxloom run or checkpoint, a Hugging "
                            f"Face model directory (config.json + *.safetensors) nor a Pax "
                            f"checkpoint (checkpoint_XXXXXXXX/)")

    def vocab_size(self, rules: list[re.Pattern]) -> tuple[int, str] | None:
        """(size, where it is read) of the vocabulary these weights fix, or None: only
        their embedding rows that no rule in `rules` leaves out fix it."""
        from paxloom.runner.state import hf_format, pax_format

        if self._read is hf_format.read_params:  # check_config: every size is the config's
            return (hf_format.hyperparameters(self.path)[1]["VOCAB_SIZE"],
                    f"{hf_format.CONFIG} vocab_size of the {self.kind}")
        read = [name for name in _VOCAB_AXES if not any(_matches(rule, name) for rule in rules)]
        shapes = (checkpoints.saved_param_shapes(self.directory, self.step)
                  if self._read is None else pax_format.param_shapes(self.path, read))
        for name in read:
            if name in shapes:
                return shapes[name][_VOCAB_AXES[name]], f"the rows of {name} in the {self.kind}"
        return None

    def read(self, abstract_params: dict, wanted: list[str]) -> dict:
        """{path: array laid out as abstract_params' leaf} for every name in `wanted`;
        UserError naming the first parameter the source lacks or holds in another shape."""
        targets = checkpoints.flat_params(abstract_params)
        if self._read is None:
            # Decoder layers stored in another layout (pipeline stages, repeated): read whole
            # to host, relaid into this model's layout (layers/layer_layout.py).
            relaid = checkpoints.relaid_params(self.directory, self.step, abstract_params)
            if relaid is not None:
                self._check({k: tuple(v.shape) for k, v in relaid.items()}, targets, wanted)
                return {name: _place(relaid[name], targets[name]) for name in wanted}
            shapes = checkpoints.saved_param_shapes(self.directory, self.step)
            self._check(shapes, targets, wanted)
            subset = checkpoints.nested_params({name: targets[name] for name in wanted})
            return checkpoints.flat_params(
                checkpoints.restore_params(self.directory, self.step, subset))
        from layers import architecture

        try:
            arch = architecture.architecture_of(self.model_config)
        except architecture.UnsupportedModel as error:
            raise UserError(f"{FLAG}: cannot map {self.kind} onto this model: {error}") from None
        arrays = self._read(self.path, arch, abstract_params)
        self._check({k: tuple(v.shape) for k, v in arrays.items()}, targets, wanted)
        return {name: _place(arrays[name], targets[name]) for name in wanted}

    def _check(self, shapes: dict, targets: dict, wanted: list[str]) -> None:
        for name in wanted:
            shape = tuple(targets[name].shape)
            if name not in shapes:
                raise UserError(
                    f"{FLAG}: {self.kind} has no parameter {name} {shape}; to keep its fresh "
                    f"initialisation, pass --fdl.CHECKPOINT_IGNORE_RULES='[\"{skip_rule(name)}\"]'")
            if tuple(shapes[name]) != shape:
                raise UserError(
                    f"{FLAG}: {self.kind} holds {name} with shape {tuple(shapes[name])}, this "
                    f"model's is {shape}: check the shape hyperparameters, or keep it freshly "
                    f"initialised with --fdl.CHECKPOINT_IGNORE_RULES='[\"{skip_rule(name)}\"]'")


def _paxloom_checkpoint(path: str) -> tuple[str | None, int | None]:
    """(checkpoint directory, step) when `path` is a Paxloom run, its checkpoints/ or one
    step's directory; (None, None) otherwise."""
    path = os.path.abspath(path)
    if os.path.isdir(os.path.join(path, "checkpoints")):
        path = os.path.join(path, "checkpoints")
    name = os.path.basename(path.rstrip("/"))
    if name.isdigit() and os.path.isdir(os.path.join(path, "state")):
        directory, step = os.path.dirname(path), int(name)
        if step not in checkpoints.all_steps(directory):
            raise UserError(f"{FLAG}={path} is an incomplete checkpoint (a save cut short); "
                            f"pass a complete step of {directory}")
        return directory, step
    if not os.path.isdir(path) or not any(n.isdigit() for n in os.listdir(path)):
        return None, None
    step = checkpoints.latest_step(path)
    if step is None:
        raise UserError(f"{FLAG}={path} holds no complete checkpoint")
    return path, step


def _place(array: np.ndarray, like) -> jax.Array:
    """A host array as a global array with `like`'s dtype and sharding; each process puts
    only its own devices' blocks."""
    array = np.asarray(array, like.dtype)
    return jax.make_array_from_callback(array.shape, like.sharding, lambda index: array[index])


def check_source(initial: InitialWeights) -> None:
    """A path that is no checkpoint, or a rule that is no regex, fails now, in one line,
    before anything is compiled."""
    _compile(initial.ignore_rules)
    _Source(initial.path, model_config=None)


def vocab_size(path: str, ignore_rules: list[str]) -> tuple[int, str] | None:
    """(size, where it is read) of the vocabulary that the starting weights at `path` fix,
    which the run's VOCAB_SIZE must then be: a Hugging Face model's config.json vocab_size,
    or the rows of a checkpoint's embedding that no ignore rule leaves out. None when they
    fix none, or `path` is no checkpoint (check_source says why)."""
    try:
        return _Source(path, model_config=None).vocab_size(_compile(ignore_rules))
    except UserError:
        return None


def load(initial: InitialWeights, params: dict, abstract_params: dict, model_config) -> dict:
    """`params` (freshly initialised, laid out as `abstract_params`) with every parameter
    that no ignore rule matches replaced by the source's; `model_config` is the run's
    praxis model config, for sources in another layout."""
    rules = _compile(initial.ignore_rules)
    names = list(checkpoints.flat_params(abstract_params))
    for rule in rules:
        if not any(_matches(rule, name) for name in names):
            raise UserError(f"CHECKPOINT_IGNORE_RULES: {rule.pattern!r} matches no parameter "
                            f"of this model (paths look like {names[0]})")
    kept = [name for name in names if any(_matches(rule, name) for rule in rules)]
    wanted = [name for name in names if name not in kept]
    source = _Source(initial.path, model_config)
    loaded = source.read(abstract_params, wanted)
    fresh, treedef = jax.tree_util.tree_flatten_with_path(params)
    merged = jax.tree_util.tree_unflatten(treedef, [
        loaded.get(checkpoints.param_path(path), leaf) for path, leaf in fresh])
    log(f"initialised {len(wanted)} of {len(names)} parameters from {source.kind}"
        + (f"; {len(kept)} keep their initialisation (CHECKPOINT_IGNORE_RULES)" if kept else "")
        + "; the optimizer starts fresh")
    return merged
