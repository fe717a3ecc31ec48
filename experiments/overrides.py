"""`--fdl.NAME=VALUE` overrides from the command line.

Two kinds, told apart by the name:
- `--fdl.LEARNING_RATE=1e-4`: an UPPER_CASE hyperparameter of the experiment class
  (checked against its declared type when the experiment is created);
- `--fdl.model.lm_tpl.stacked_transformer_tpl.num_layers=4`: any field of the run's
  Fiddle graph, by its dotted path (`evals[0].name` indexes a list), set after the
  graph is built, as Fiddle's own `--fdl.` flags do in paxml.

VALUE is a Python literal (8, 0.5, [1,8,1], "bfloat16"); a bare word is taken as a
string where a string is expected, and a bool takes True/False, true/false, yes/no or 1/0
in any case. Every mistake is a one-line UserError.
"""

import ast
import re

import fiddle as fdl

from paxloom.core.errors import UserError, near_matches, unknown_name

FDL_PREFIX = "--fdl."
_HYPERPARAMETER = re.compile(r"[A-Z][A-Z0-9_]*")
_COMPONENT = re.compile(r"([A-Za-z_]\w*)((?:\[\d+\])*)")


def split(argv: list[str]) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """argv -> (other flags, hyperparameter overrides, graph path overrides); raw strings."""
    rest, hyperparameters, paths = [], {}, {}
    for arg in argv:
        if not arg.startswith(FDL_PREFIX):
            rest.append(arg)
            continue
        name, eq, value = arg[len(FDL_PREFIX):].partition("=")
        if not eq or not name:
            raise UserError(f"{arg}: write overrides as --fdl.NAME=VALUE")
        (hyperparameters if _HYPERPARAMETER.fullmatch(name) else paths)[name] = value
    return rest, hyperparameters, paths


def literal(flag: str, raw: str, bare_word_ok: bool):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        if bare_word_ok:
            return raw
        raise UserError(f"{flag}={raw}: not a Python literal "
                        f"(e.g. 8, 0.5, [1,8,1], \"bfloat16\")") from None


# What people type for a bool on a command line (lower-cased), beside Python's True/False.
_BOOLEANS = {"true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}


def boolean(flag: str, raw: str, none_ok: bool = False):
    """A bool field's VALUE: True/False, true/false, yes/no or 1/0 in any case (and None
    where the field takes None); anything else is a one-line UserError."""
    word = raw.strip()
    if none_ok and word == "None":
        return None
    if word.lower() not in _BOOLEANS:
        raise UserError(f"{flag}={raw}: not a bool; write True or False")
    return _BOOLEANS[word.lower()]


def hyperparameter_values(overrides: dict[str, str], declared: dict[str, type]) -> dict:
    """Raw strings -> Python values. A bare word (a path) is accepted for str hyperparameters."""
    values = {}
    for name, raw in overrides.items():
        flag, hint = f"--fdl.{name}", declared.get(name)
        if hint in (bool, bool | None):
            values[name] = boolean(flag, raw, none_ok=hint is not bool)
        else:
            # An undeclared name takes a bare word too, so its error is the unknown name's
            # (with MaxText's spelling translated: --fdl.REMAT_POLICY=full), not the literal's.
            values[name] = literal(flag, raw, hint in (str, str | None, str | type, None))
    return values


def apply_to_graph(config: fdl.Buildable, overrides: dict[str, str],
                   hyperparameter_names=()) -> list[str]:
    """Set each dotted path of the graph to its value; return 'path: old -> new' lines.

    A value replaces a value of a compatible type only: a sub-config (a layer, an
    optimizer) cannot become a literal, and an int field takes no string.
    """
    changes = []
    for path, raw in overrides.items():
        flag = f"--fdl.{path}"
        parent, last = _resolve_parent(config, path, flag, hyperparameter_names, raw)
        old = _get(parent, last)
        if isinstance(old, fdl.Buildable):
            hint = unknown_name(path, hyperparameter_names, raw) if "." not in path else ""
            raise UserError(f"{flag}: {path} is a {type(old).__name__} of "
                            f"{fdl.get_callable(old).__name__}, not a value; set one of its "
                            f"fields ({path}.NAME=VALUE){hint}")
        value = (boolean(flag, raw) if isinstance(old, bool) else
                 literal(flag, raw, isinstance(old, str)))
        _check_type(flag, old, value)
        if isinstance(old, float) and isinstance(value, int):
            value = float(value)
        if isinstance(last, str):
            check_range(flag, last, value)
        _set(parent, last, value)
        changes.append(f"{path}: {old!r} -> {value!r}")
    return changes


# The ranges of graph fields, by field name: the same rules the UPPER_CASE hyperparameters
# that set them follow (experiments/base.py validate), wherever in the graph they are.
_POSITIVE = frozenset((
    "max_steps", "summary_interval_steps", "num_layers", "num_heads", "num_kv_heads",
    "model_dims", "hidden_dims", "dim_per_head", "input_dims", "output_dims", "embedding_dims",
    "vocab_size", "num_classes", "max_seq_len", "seq_len", "seqlen", "percore_batch_size",
    "global_batch_size", "gradient_accumulation_steps", "num_stages", "num_microbatches",
    "circular_repeat", "learning_rate"))
_NON_NEGATIVE = frozenset((
    "eval_interval_steps", "checkpoint_every_n_steps", "checkpoint_max_to_keep", "num_batches",
    "warmup_steps", "decay_start", "decay_end", "loss_chunk_len", "weight_decay"))
_MESH_SHAPES = frozenset(("ici_mesh_shape", "dcn_mesh_shape"))


def check_range(flag: str, field: str, value) -> None:
    """A graph field's value within the range its hyperparameter has: one-line UserError."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if field in _MESH_SHAPES and isinstance(value, (list, tuple)):
        if not value or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1
                                for d in value):
            raise UserError(f"{flag}={list(value)}: a mesh shape needs positive sizes, "
                            f"e.g. [1,8,1]")
        return
    if not number(value):
        return
    if field in _POSITIVE and not value > 0:  # also refuses NaN
        raise UserError(f"{flag}={value!r}: must be positive")
    if field in _NON_NEGATIVE and not value >= 0:
        raise UserError(f"{flag}={value!r}: must be >= 0")
    if field.endswith("dropout_prob") or field.endswith("droppath_prob"):
        if not 0.0 <= value < 1.0:
            raise UserError(f"{flag}={value!r}: must be a probability in [0, 1)")
    if field == "keep_prob" and not 0.0 < value <= 1.0:
        raise UserError(f"{flag}={value!r}: must be a probability in (0, 1]")


def _components(path: str, flag: str) -> list[str | int]:
    """'evals[0].make_input.seq_len' -> ['evals', 0, 'make_input', 'seq_len']."""
    parts: list[str | int] = []
    for piece in path.split("."):
        match = _COMPONENT.fullmatch(piece)
        if not match:
            raise UserError(f"{flag}: {piece!r} is not a field name; write paths as "
                            f"model.lm_tpl.NAME or evals[0].NAME")
        parts.append(match.group(1))
        parts += [int(i) for i in re.findall(r"\[(\d+)\]", match.group(2))]
    return parts


def _fields(node) -> list[str]:
    if isinstance(node, fdl.Buildable):
        return list(node.__arguments__) + [
            n for n in node.__signature_info__.parameters if n not in node.__arguments__]
    return []


def _resolve_parent(config, path: str, flag: str, hyperparameter_names, raw=None):
    parts = _components(path, flag)
    node, walked = config, ""
    for part in parts[:-1]:
        _get_checked(node, part, walked, flag, hyperparameter_names)
        node = _get(node, part)
        walked = f"{walked}[{part}]" if isinstance(part, int) else f"{walked}.{part}".lstrip(".")
    last = parts[-1]
    _get_checked(node, last, walked, flag, hyperparameter_names, raw)
    return node, last


def _get_checked(node, part, walked, flag, hyperparameter_names, raw=None) -> None:
    where = walked or "the run's Fiddle graph"
    if isinstance(part, int):
        if not isinstance(node, (list, tuple)) or not 0 <= part < len(node):
            size = len(node) if isinstance(node, (list, tuple)) else "no"
            raise UserError(f"{flag}: {where} has {size} items; index {part} is out of range")
        return
    if not isinstance(node, fdl.Buildable):
        raise UserError(f"{flag}: {where} is {node!r}, which has no field {part}")
    fields = _fields(node)
    accepts_any = any(p.kind == p.VAR_KEYWORD
                      for p in node.__signature_info__.parameters.values())
    if part not in fields and not accepts_any:
        candidates = fields + (list(hyperparameter_names) if not walked else [])
        # At the top, a lower-case MaxText name (--fdl.per_device_batch_size) gets its
        # Paxloom equivalent; deeper, a field's name is the graph's own.
        hint = (unknown_name(part, candidates, raw) if not walked and raw is not None
                else near_matches(part, candidates))
        raise UserError(f"{flag}: {where} ({fdl.get_callable(node).__name__}) has no field "
                        f"{part}{hint}; --print_config lists the graph's fields")


def _get(node, part):
    return node[part] if isinstance(part, int) else getattr(node, part)


def _set(node, part, value) -> None:
    if isinstance(part, int):
        node[part] = value
    else:
        setattr(node, part, value)


def _check_type(flag: str, old, value) -> None:
    """The new value must be of the old value's kind (None and missing take anything)."""
    if old is None:
        return
    kinds = [(bool, (bool,)), (int, (int,)), (float, (int, float)), (str, (str,)),
             ((list, tuple), (list, tuple))]
    for old_kind, allowed in kinds:
        if isinstance(old, old_kind):
            ok = isinstance(value, allowed) and not (
                isinstance(value, bool) and not isinstance(old, bool))
            if not ok:
                raise UserError(f"{flag}={value!r}: the field holds {type(old).__name__} "
                                f"({old!r}), not {type(value).__name__}")
            return
