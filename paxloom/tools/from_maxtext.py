"""A MaxText recipe as a Paxloom experiment, in one command.

    python -m paxloom.tools.from_maxtext llama3_8b.yml [key=value ...] [--output=my_llama.py]

reads a MaxText config as MaxText's pyconfig does: a YAML file whose `base_config:` names
another (beside it, or in a folder above it as MaxText's configs/ holds base.yml), chained,
then `models/MODEL_NAME.yml` when the config names a model_name and such a file is found
beside it or above, then the `key=value` overrides of the command line; later ones win.
It prints (or writes to --output) a Python module holding one registered experiment: a
subclass of the closest Paxloom experiment (the one of that model_name's shape,
experiments.Llama31_8B for llama3.1-8b, else the family of decoder_block: the Llama family,
with its mixture of experts when num_experts > 1, or the GPT), every translated setting a
class attribute under a comment naming the MaxText setting, the flags (--job_log_dir,
--vocab_path, ...) in the command of its docstring, and a comment for each setting that has
no Paxloom equivalent, with the reason. The names come from one table,
paxloom/core/maxtext_names.py (docs/guides/from-maxtext.md shows it).

MaxText's -1 ("fill the rest") in an ici_* or dcn_* axis fills it to --gpus_per_node GPUs
a node and --num_nodes nodes. The experiment is checked before it is written (its
hyperparameters' types, choices and checks, as main.py would); a mistake is one line and
exit status 2.
"""

import os
import re
import sys
import textwrap

import yaml
from absl import flags

import experiments
from paxloom.core import maxtext_names
from paxloom.core.errors import UserError
from paxloom.tools import cli

# Flags of its own, not absl's global ones: export_hf has an --output of its own, and a test
# may import both.
FLAGS = flags.FlagValues()
flags.DEFINE_string("output", None, "Write the module to this file (its name is the module "
                    "--fdl_config imports); default: print it.", flag_values=FLAGS)
flags.DEFINE_string("class_name", None, "The experiment class's name; default: from the "
                    "config file's name.", flag_values=FLAGS)
flags.DEFINE_integer("gpus_per_node", maxtext_names.GPUS_PER_NODE, "What MaxText's -1 fills an "
                     "ici_*_parallelism axis to.", flag_values=FLAGS)
flags.DEFINE_integer("num_nodes", 1, "What MaxText's -1 fills a dcn_*_parallelism axis to.",
                     flag_values=FLAGS)
HELP = ("-h", "-?", "--help", "--helpshort", "--helpfull")

BASE_CONFIG = "base_config"
BASE_CLASS = "the base class"


class _Loader(yaml.SafeLoader):
    """YAML as MaxText reads it (OmegaConf): 1e-5 is a float, as 1.e-5 is."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _read_yaml(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            loaded = yaml.load(f, Loader=_Loader)
    except OSError as error:
        raise UserError(f"{path}: cannot read it ({error.strerror})") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise UserError(f"{path}{where}: not YAML ({getattr(error, 'problem', error)})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise UserError(f"{path}: a MaxText config is a mapping of settings, not a "
                        f"{type(loaded).__name__}")
    return loaded


def _find(name: str, directory: str) -> str | None:
    """`name` in `directory` or the nearest folder above it (MaxText keeps base.yml in its
    configs/ folder, above the recipes of configs/gpu/models/)."""
    if os.path.isabs(name):
        return name if os.path.isfile(name) else None
    directory = os.path.abspath(directory)
    while True:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def _chain(path: str, seen: tuple[str, ...] = ()) -> tuple[dict, list[str]]:
    """The settings of `path` over those of its base_config chain, and the files read, the
    base first."""
    path = os.path.abspath(path)
    if path in seen:
        raise UserError(f"{path}: base_config goes round in a circle ({' -> '.join(seen)})")
    settings = _read_yaml(path)
    base = settings.pop(BASE_CONFIG, None)
    if not base:
        return settings, [path]
    found = _find(str(base), os.path.dirname(path))
    if found is None:
        raise UserError(f"{path}: its base_config {base!r} is neither beside it nor in a "
                        f"folder above it; put it there (MaxText's configs/base.yml for "
                        f"'base.yml'), or remove the line to translate this file alone")
    base_settings, files = _chain(found, (*seen, path))
    return {**base_settings, **settings}, [*files, path]


def override(arg: str) -> tuple[str, object]:
    """A command line's `key=value`, its value read as YAML as MaxText reads it."""
    key, eq, raw = arg.partition("=")
    if not eq or not re.fullmatch(r"[A-Za-z_]\w*", key):
        raise UserError(f"{arg!r}: MaxText's overrides look like key=value "
                        f"(e.g. per_device_batch_size=4)")
    if raw == "":
        return key, ""
    try:
        return key, yaml.load(raw, Loader=_Loader)
    except yaml.YAMLError:
        return key, raw


def load(config: str, overrides: list[str]) -> tuple[dict, list[str], set[str]]:
    """MaxText's settings of `config` (its base_config chain, then its model_name's
    models/NAME.yml, then `overrides`), the files read, and the settings whose value is
    MaxText's default: the chain's base.yml's, set by nothing after it."""
    if not os.path.isfile(config):
        raise UserError(f"{config}: no such file (a MaxText config, e.g. "
                        f"configs/gpu/models/llama3_8b.yml)")
    settings, files = _chain(config)
    defaults = set()
    if len(files) > 1 and os.path.basename(files[0]) == "base.yml":
        root = _read_yaml(files[0])
        defaults = {k for k, v in root.items() if k in settings and settings[k] == v}
    command_line = dict(override(arg) for arg in overrides)
    model_name = command_line.get("model_name", settings.get("model_name"))
    if model_name and model_name != "default":
        name = str(model_name).replace("-Instruct", "")
        model_file = _find(os.path.join("models", f"{name}.yml"), os.path.dirname(config))
        if model_file and os.path.abspath(model_file) not in files:
            model_settings = _read_yaml(model_file)
            model_settings.pop(BASE_CONFIG, None)
            settings.update(model_settings)
            files.append(os.path.abspath(model_file))
            defaults -= set(model_settings)
    settings.update(command_line)
    return settings, files, defaults - set(command_line)


# ----- the experiment -------------------------------------------------------------------


def base_experiment(settings: dict) -> tuple[str, type, str]:
    """(the --fdl_config of the experiment to subclass, its class, why that one)."""
    ctx = maxtext_names.Context(settings)
    chosen, why = None, ""
    if settings.get("model_name", "default") != "default":
        try:
            mapped = maxtext_names.convert(maxtext_names.BY_NAME["model_name"],
                                           settings["model_name"], ctx)
            chosen = mapped.values.get("--fdl_config")
            why = f"model_name {settings['model_name']}"
        except maxtext_names.NoEquivalent:
            pass
    if chosen is None:
        block = ctx.get("decoder_block")
        try:
            mapped = maxtext_names.convert(maxtext_names.BY_NAME["decoder_block"], block, ctx)
            chosen, why = mapped.values["--fdl_config"], f"decoder_block {block}"
        except maxtext_names.NoEquivalent:
            chosen = maxtext_names.FAMILY_EXPERIMENTS["llama"]
            why = f"decoder_block {block} has no Paxloom family; the Llama family's is closest"
    cls = experiments.resolve(chosen)
    if ctx.get("num_experts") > 1 and cls.reads_gpt_architecture:
        chosen = maxtext_names.FAMILY_EXPERIMENTS["llama"]
        cls, why = experiments.resolve(chosen), "num_experts > 1: the Llama family's experts"
    return chosen, cls, why


def translate(settings: dict, gpus_per_node: int = maxtext_names.GPUS_PER_NODE,
              num_nodes: int = 1):
    """(base --fdl_config, base class, why, entries, hyperparameters, flags): each entry
    (MaxText key, value, Mapped or the reason there is none)."""
    chosen, cls, why = base_experiment(settings)
    family = "gpt" if cls.reads_gpt_architecture else "llama"
    ctx = maxtext_names.Context(settings, family, gpus_per_node, num_nodes)
    declared = cls.hyperparameter_types()
    entries, hyperparameters, command_flags = [], {}, {}
    for key, value in settings.items():
        setting = maxtext_names.BY_NAME.get(key)
        if setting is None:
            entries.append((key, value, "not in Paxloom's table of MaxText settings "
                                        "(paxloom/core/maxtext_names.py)"))
            continue
        try:
            mapped = maxtext_names.convert(setting, value, ctx)
        except maxtext_names.NoEquivalent as error:
            entries.append((key, value, str(error)))
            continue
        values = {n: v for n, v in mapped.values.items() if n != "--fdl_config"}
        if "--fdl_config" in mapped.values:  # model_name, decoder_block: the class's base
            mapped = maxtext_names.Mapped({}, f"{BASE_CLASS}: {cls.__name__}, by {why}")
        missing = [n for n in values if not n.startswith("--") and n not in declared]
        if missing:
            entries.append((key, value, f"{', '.join(missing)}: not a hyperparameter of "
                                        f"{cls.__name__}"))
            continue
        entries.append((key, value, maxtext_names.Mapped(values, mapped.note)))
        for name, v in values.items():
            (command_flags if name.startswith("--") else hyperparameters)[name] = v
    return chosen, cls, why, entries, hyperparameters, command_flags


def class_name(config: str) -> str:
    """llama3_8b.yml -> Llama3_8b: CamelCase, an underscore kept between two digits' words."""
    words = [w for w in re.split(r"[^0-9A-Za-z]+", os.path.splitext(os.path.basename(config))[0])
             if w]
    name = ""
    for word in words:
        joiner = "_" if name and name[-1].isdigit() and word[0].isdigit() else ""
        name += joiner + word[:1].upper() + word[1:]
    if not name.isidentifier() or name in experiments.registered():
        name = "MaxText" + name
    return name


def _shown(value) -> str:
    return value if isinstance(value, str) else repr(value)


def _comment(text: str, indent: str = "    ") -> list[str]:
    return textwrap.wrap(text, width=96 - len(indent), initial_indent=f"{indent}# ",
                         subsequent_indent=f"{indent}#   ", break_on_hyphens=False,
                         break_long_words=False)


def module_text(config: str, files: list[str], overrides: list[str], name: str, module: str,
                chosen: str, cls: type, why: str, entries, hyperparameters: dict,
                command_flags: dict, defaults: set[str] = frozenset()) -> str:
    """The Python module: imports, the registered class, its docstring's command."""
    base_module, _, base_name = chosen.rpartition(".")
    if base_module == "experiments":  # a registered experiment: import it from its module
        base_module = cls.__module__
    job_dir = command_flags.pop("--job_log_dir", f"runs/{name}")
    command = " ".join(["PYTHONPATH=. python main.py", f"--fdl_config={module}.{name}",
                        f"--job_log_dir={job_dir}"]
                       + [maxtext_names.render(n, v) for n, v in command_flags.items()])
    read = ", ".join(os.path.relpath(f, os.path.dirname(os.path.abspath(config)))
                     for f in files)
    source = " ".join([os.path.basename(config), *overrides])
    lines = [
        *textwrap.wrap(f'"""MaxText\'s {source}, as a Paxloom experiment (python -m '
                       f'paxloom.tools.from_maxtext).', width=96, break_on_hyphens=False),
        "",
        *textwrap.wrap(f"Read: {read}. Each hyperparameter names the MaxText setting it "
                       f"comes from; the settings Paxloom has no equivalent for are the "
                       f"comments at the end of the class, each with the reason "
                       f"(paxloom/core/maxtext_names.py).", width=96, break_on_hyphens=False),
        '"""',
        "",
        "from experiments import register",
        f"from {base_module} import {base_name}",
        "",
        "",
        "@register",
        f"class {name}({base_name}):",
        f'    """MaxText\'s {os.path.basename(config)} on {base_name} ({why}).',
        "",
        f"    {command}",
        '    """',
        "",
    ]
    written, unmapped, unknown_defaults = set(), [], 0
    for key, value, result in entries:
        if isinstance(result, str):
            if key in defaults and key not in maxtext_names.BY_NAME:
                unknown_defaults += 1  # base.yml's, which the recipe leaves as it is
            else:
                unmapped.append((key, value, result))
            continue
        fresh = {n: hyperparameters[n] for n in result.values
                 if not n.startswith("--") and n not in written}
        flags_set = [maxtext_names.render(n, v) for n, v in result.values.items()
                     if n.startswith("--")]
        if flags_set:
            how = "in the command above: " + " ".join(flags_set)
        elif fresh:
            how = ""
        elif result.values:
            how = "with the above"
        else:
            how = "" if result.note.startswith(BASE_CLASS) else "nothing to set"
        note = "; ".join(t for t in (how, result.note) if t)
        lines += _comment(f"{key}: {_shown(value)}" + (f" ({note})" if note else ""))
        for n, v in fresh.items():
            lines.append(f"    {n} = {v!r}")
        written |= set(fresh)
    if unmapped or unknown_defaults:
        lines += ["", "    # Not translated (MaxText setting: its value; why):"]
        for key, value, reason in unmapped:
            lines += _comment(f"{key}: {_shown(value)}; {reason}")
        if unknown_defaults:
            lines += _comment(f"and {unknown_defaults} more settings of base.yml at MaxText's "
                              f"defaults, not in Paxloom's table (paxloom/core/maxtext_names.py)")
    if not written:
        lines.append("    pass")
    return "\n".join(lines) + "\n"


def check(cls: type, hyperparameters: dict, config: str) -> None:
    """The translated hyperparameters as main.py checks them (types, choices, the groups'
    checks), so the module written always resolves."""
    try:
        cls(**hyperparameters)
    except UserError as error:
        raise UserError(f"{config}: the translated experiment is refused: {error}") from None


def main(argv: list[str]) -> None:
    if any(arg in HELP for arg in argv[1:]):
        print(f"{__doc__}\n{FLAGS.module_help(__name__) or FLAGS.get_help()}")
        return
    FLAGS.unparse_flags()  # main() may run more than once in a process (tests)
    try:
        positional = FLAGS(argv)[1:]
    except flags.Error as error:
        raise UserError(str(error)) from None
    if not positional:
        raise UserError("a MaxText config is required: python -m paxloom.tools.from_maxtext "
                        "CONFIG.yml [key=value ...] [--output=FILE]")
    config, overrides = positional[0], positional[1:]
    if FLAGS.gpus_per_node < 1 or FLAGS.num_nodes < 1:
        raise UserError("--gpus_per_node and --num_nodes must be at least 1")
    settings, files, defaults = load(config, overrides)
    chosen, cls, why, entries, hyperparameters, command_flags = translate(
        settings, FLAGS.gpus_per_node, FLAGS.num_nodes)
    check(cls, hyperparameters, config)
    name = FLAGS.class_name or class_name(config)
    if not name.isidentifier():
        raise UserError(f"--class_name={name}: not a Python class name")
    module = (os.path.splitext(os.path.basename(FLAGS.output))[0] if FLAGS.output
              else "MODULE")
    text = module_text(config, files, overrides, name, module, chosen, cls, why, entries,
                       hyperparameters, command_flags, defaults)
    if not FLAGS.output:
        sys.stdout.write(text)
        return
    if not module.isidentifier():
        raise UserError(f"--output={FLAGS.output}: {module} is not a module name Python "
                        f"can import; name the file like my_recipe.py")
    try:
        with open(FLAGS.output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as error:
        raise UserError(f"--output={FLAGS.output}: cannot write it ({error.strerror})") from None
    where = os.path.dirname(os.path.abspath(FLAGS.output))
    print(f"wrote {FLAGS.output}: {name}({cls.__name__}); PYTHONPATH={where} python main.py "
          f"--fdl_config={module}.{name} --job_log_dir=... runs it")


if __name__ == "__main__":
    cli.run(main)
