"""How an experiment's hyperparameters are declared and checked.

A hyperparameter is an UPPER_CASE class attribute with a type annotation and a default,
declared in a group (experiments/groups.py: model, parallelism, pipeline, optimizer, ...),
each group with its own checks. A subclass may only *assign* declared names: a misspelt
attribute such as `LR_COS_MIN_RATO = 0.1` is an error when the class is created, with the
near match, instead of being silently ignored. A user declares a new hyperparameter by
annotating it (`MY_KNOB: int = 3`).
"""

import types
import typing

from experiments import pax_compat
from paxloom.core.errors import UserError, unknown_choice, unknown_name


class Group:
    """A group of hyperparameters: annotated UPPER_CASE defaults, and in `_check(self)` the
    checks that need several of them (UserError). Not instantiated on its own."""


class Hyperparameters:
    """What BaseExperiment inherits: the declared names, their values, their checks."""

    # Allowed values of the string hyperparameters that name a choice (every group's).
    CHOICES: typing.ClassVar[dict[str, tuple]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        declared = cls.hyperparameter_types()
        own_annotations = cls.__dict__.get("__annotations__", {})
        for name, value in vars(cls).items():
            if not is_hyperparameter_name(name):
                continue
            if name in pax_compat.IGNORED:
                pax_compat.note_ignored(cls, name)
                continue
            if name not in declared:
                raise UserError(
                    f"{cls.__module__}.{cls.__name__} sets {name}, which is not a declared "
                    f"hyperparameter{unknown_name(name, declared, value, flag=False)}; to "
                    f"add a new one, annotate it: `{name}: int = ...`"
                )
            if name not in own_annotations:
                check_value(f"{cls.__name__}.{name}", name, value, declared[name],
                            cls.CHOICES)

    @classmethod
    def groups(cls) -> list[type]:
        """The hyperparameter groups, in the order they are declared and checked."""
        return [klass for klass in cls.__mro__ if issubclass(klass, Group) and klass is not Group
                and Group in klass.__bases__]

    @classmethod
    def hyperparameter_types(cls) -> dict[str, type]:
        """Declared names and their types: the groups' in their order, then each subclass's
        own, base class first."""
        groups = cls.groups()
        types_: dict[str, type] = {}
        for klass in groups + [k for k in reversed(cls.__mro__) if k not in groups]:
            for name, hint in vars(klass).get("__annotations__", {}).items():
                if is_hyperparameter_name(name):
                    types_[name] = hint
        return types_

    def __init__(self, **overrides):
        """An experiment instance: class defaults plus `overrides` (from `--fdl.NAME=VALUE`)."""
        declared = self.hyperparameter_types()
        for name, value in overrides.items():
            if name not in declared:
                raise UserError(
                    f"--fdl.{name}: {type(self).__name__} has no hyperparameter {name}"
                    f"{unknown_name(name, declared, value)}"
                )
            check_value(f"--fdl.{name}", name, value, declared[name], self.CHOICES)
            if float in (declared[name], optional_of(declared[name])) and value is not None:
                value = float(value)
            elif isinstance(value, tuple):
                value = list(value)
            setattr(self, name, value)
        self.validate()

    def hyperparameters(self) -> dict[str, typing.Any]:
        """The effective value of every hyperparameter, in declaration order. A class (Pax's
        `ACTIVATION_CLS = layers.GELU`) is given by name, as `--fdl.NAME=` takes it back."""
        return {name: class_name(getattr(self, name)) for name in self.hyperparameter_types()}

    def validate(self) -> None:
        """Every group's checks, in the groups' order. Raise UserError."""
        for group in self.groups():
            check = vars(group).get("_check")
            if check is not None:
                check(self)


def class_name(value):
    """A class as the name ACTIVATION_CLS takes back: praxis activations by bare name,
    others as module.Class; any other value as it is."""
    if not isinstance(value, type):
        return value
    from praxis.layers import activations

    if getattr(activations, value.__name__, None) is value:
        return value.__name__
    return f"{value.__module__}.{value.__qualname__}"


def is_hyperparameter_name(name: str) -> bool:
    return name.isupper() and not name.startswith("_") and name != "CHOICES"


def type_name(hint) -> str:
    if optional_of(hint) is not None:
        return f"{type_name(optional_of(hint))} or None"
    return str(hint) if typing.get_origin(hint) else hint.__name__


def optional_of(hint):
    """T for a `T | None` hint, else None."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return inner
    return None


def check_value(where: str, name: str, value, hint, choices: dict) -> None:
    """Raise UserError unless `value` fits the declared type (and choices) of `name`."""
    if not _fits(value, hint):
        example = {int: "8", float: "0.5", bool: "True", str: '"bfloat16"',
                   list[str]: '["^.*lora.*$"]'}.get(optional_of(hint) or hint, "[1,8,1]")
        raise UserError(
            f"{where}={value!r} has type {type(value).__name__}, but {name} is "
            f"{type_name(hint)} (e.g. {example})"
        )
    if name in choices and value not in choices[name]:
        raise UserError(
            f"{where}={value!r} is not one of {', '.join(choices[name])}"
            f"{unknown_choice(name, value, choices[name], flag=where.startswith('--'))}"
        )


def _fits(value, hint) -> bool:
    """`value` is of the declared type `hint` (T, list[T], or either `| None`)."""
    if optional_of(hint) is not None:
        return value is None or _fits(value, optional_of(hint))
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, (list, tuple)) and all(_is_instance(v, item) for v in value)
    return _is_instance(value, hint)


def _is_instance(value, hint) -> bool:
    if hint is float:  # an int is a fine float; a bool is not a number here
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)
