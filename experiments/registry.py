"""The experiment registry: `@register` and lookup by `--fdl_config` name."""

import importlib
import inspect

from paxloom.core.errors import UserError, near_matches

_REGISTRY: dict[str, type] = {}
# The module of the Pax GPU experiments (configs.py beside paxml's GPU scripts): its
# experiment names are Paxloom's, so `--fdl_config=paxml...configs.GPT126M` just works.
PAX_GPU_CONFIGS = "paxml.contrib.gpu.scripts_gpu.configs"
# NVIDIA's Pax experiments (paxml/tasks/lm/params/nvidia.py at paxml's head, 2024-09) are
# not carried. Its mixtures of experts, with what each needs that Paxloom does not have.
PAX_NVIDIA = "paxml.tasks.lm.params.nvidia"
_PADDED = ("its {} experts padded with empty variables to fill the {}-way data axis, "
           "as Pax pads them")
_EXPERT_AXIS = ("praxis's expert mesh axis 'data_expert' "
                "(set_sharding_params_with_expert_parallelism, after praxis 1.4.0)")
NVIDIA_MIXTURES = {
    "MoELarge": _PADDED.format(16, 32),
    "GLaM64B64EProxy": _PADDED.format(64, 128),
    "GLaM64B64EProxy_EP": _EXPERT_AXIS,
    **{name: f"{_EXPERT_AXIS} and praxis/layers/grok.py (also after 1.4.0)"
       for name in ("Grok", "Grok_Proxy", "Grok_Proxy_PP", "Grok_PP")},
}


def register(cls: type) -> type:
    """Class decorator: make `cls` available as `--fdl_config=experiments.<Name>`."""
    name = cls.__name__
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise UserError(f"experiment {name} is registered twice "
                        f"({_REGISTRY[name].__module__} and {cls.__module__})")
    _REGISTRY[name] = cls
    return cls


def registered() -> dict[str, type]:
    return dict(sorted(_REGISTRY.items()))


def resolve(fdl_config: str) -> type:
    """`experiments.NAME` (registered) or `some.module.Class` (any importable subclass)."""
    from experiments.base import BaseExperiment

    module_name, _, class_name = fdl_config.rpartition(".")
    if module_name == PAX_GPU_CONFIGS:  # the real Pax scripts' names run as they are
        module_name = "experiments"
    if module_name == PAX_NVIDIA and class_name in NVIDIA_MIXTURES:
        raise UserError(f"--fdl_config={fdl_config} needs {NVIDIA_MIXTURES[class_name]}; "
                        f"Paxloom's mixtures of experts are Pax's GLaM (experiments."
                        f"PileGLaM126M64E) and the Llama family's (experiments.Mixtral8x7B, "
                        f"EXPERT_AXIS): docs/guides/moe.md")
    if module_name == PAX_NVIDIA:
        raise UserError(f"--fdl_config={fdl_config}: Paxloom does not carry NVIDIA's "
                        f"nvidia.py; `python main.py --list_experiments` lists its experiments")
    if not module_name or not class_name:
        raise UserError(f"--fdl_config={fdl_config!r}: expected experiments.NAME or "
                        f"my_module.MyExperiment")
    if module_name == "experiments":
        if class_name not in _REGISTRY:
            raise UserError(f"--fdl_config: no experiment named {class_name}"
                            f"{near_matches(class_name, _REGISTRY)}; "
                            f"`python main.py --list_experiments` lists them")
        return _REGISTRY[class_name]
    module = _import(module_name, fdl_config)
    cls = getattr(module, class_name, None)
    if cls is None:
        names = [n for n, v in vars(module).items() if isinstance(v, type)]
        raise UserError(f"--fdl_config: {module_name} has no class {class_name}"
                        f"{near_matches(class_name, names)}")
    if not (isinstance(cls, type) and issubclass(cls, BaseExperiment)):
        raise UserError(f"--fdl_config={fdl_config} is not a subclass of "
                        f"experiments.base.BaseExperiment")
    return cls


def experiments_in(module_name: str) -> dict[str, type]:
    """The experiment classes a user's module defines, by the name --fdl_config takes
    (`--list_experiments --fdl_config=my_exps`)."""
    from experiments.base import BaseExperiment

    module = _import(module_name, module_name)
    return {f"{module_name}.{name}": value for name, value in sorted(vars(module).items())
            if isinstance(value, type) and issubclass(value, BaseExperiment)
            and value.__module__ == module.__name__}


def summary(cls: type) -> str:
    """The first sentence of `cls`'s docstring, whole (--list_experiments): up to the
    first full stop that ends a sentence, one not inside brackets or backquotes ("Brown et
    al. 2020", "(e.g. 8)") nor followed by more of a word ("46.7B", "configs.Pile5B"); the
    first paragraph when none does."""
    paragraph = " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split())
    depth, quoted = 0, False
    for i, char in enumerate(paragraph):
        if char == "`":
            quoted = not quoted
        elif not quoted and char in "([{":
            depth += 1
        elif not quoted and char in ")]}":
            depth = max(depth - 1, 0)
        elif (char in ".?!" and not depth and not quoted
              and (i + 1 == len(paragraph) or paragraph[i + 1] == " ")):
            return paragraph[:i + 1]
    return paragraph


def _import(module_name: str, fdl_config: str):
    """The user's module, or one line saying why it cannot be imported."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise UserError(f"--fdl_config={fdl_config}: cannot import {module_name} ({error}); "
                        f"is it on PYTHONPATH?") from None
    except UserError:
        raise
    except Exception as error:  # the user's module itself is broken: say where, in one line
        detail = " ".join(str(error).split())
        raise UserError(f"--fdl_config={fdl_config}: importing {module_name} failed: "
                        f"{type(error).__name__}: {detail}") from None
