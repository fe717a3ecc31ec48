"""What a launch script (scripts_gpu/) set on main.py's command line, and which of it replaces
a value the experiment class declares: the note at the start of a run.

Pax's scripts pass Pax's flags whatever the experiment (`--fdl.ICI_MESH_SHAPE=[8,1,1]`,
`--fdl.PERCORE_BATCH_SIZE=4`, the precision), so an experiment's own FSDP mesh would
silently become pure data parallelism. Paxloom's scripts pass the same flags and list the
ones they chose in $PAXLOOM_LAUNCHER_FLAGS, one `--fdl.NAME=VALUE<TAB>how to keep the
experiment's own` a line (scripts_gpu/common.sh launcher_flag): the one record of what the
launcher set. A flag is the launcher's when the command line holds it exactly once, as
listed; a user's own `--fdl.NAME=` (after the launcher's, or on main.py directly) is not.
"""

import dataclasses
import os

from experiments import overrides
from experiments.hyperparameters import class_name

ENV = "PAXLOOM_LAUNCHER_FLAGS"


@dataclasses.dataclass(frozen=True)
class LauncherFlag:
    name: str  # the hyperparameter
    raw: str  # its VALUE as the launcher passed it
    keep: str  # how to keep the experiment's own value ("set ICI_MESH_SHAPE= to keep it")


def launcher_flags(argv: list[str], environ=None) -> list[LauncherFlag]:
    """The hyperparameters $PAXLOOM_LAUNCHER_FLAGS lists that `argv` holds as the launcher
    passed them, once."""
    environ = os.environ if environ is None else environ
    found = []
    for line in environ.get(ENV, "").splitlines():
        flag, _, keep = line.partition("\t")
        name, eq, raw = flag.removeprefix(overrides.FDL_PREFIX).partition("=")
        if not flag.startswith(overrides.FDL_PREFIX) or not eq:
            continue
        given = [arg for arg in argv if arg.startswith(f"{overrides.FDL_PREFIX}{name}=")]
        if given == [flag]:
            found.append(LauncherFlag(name, raw, keep))
    return found


def replacements(exp, flags: list[LauncherFlag]) -> list[str]:
    """'NAME VALUE from the launcher replaces Class's DECLARED (how to keep it)' for each
    launcher flag whose value differs from what the experiment class declares."""
    cls, values = type(exp), exp.hyperparameters()
    lines = []
    for flag in flags:
        if flag.name not in values:
            continue
        value, declared = values[flag.name], class_name(getattr(cls, flag.name))
        if _plain(value) == _plain(declared):
            continue
        lines.append(f"{flag.name} {_shown(value)} from the launcher replaces {cls.__name__}'s "
                     f"{_shown(declared)}" + (f" ({flag.keep})" if flag.keep else ""))
    return lines


def note(exp, argv: list[str], environ=None) -> str | None:
    """The start of a run's line naming each hyperparameter the launcher replaced, or None."""
    lines = replacements(exp, launcher_flags(argv, environ))
    return f"note: {'; '.join(lines)}" if lines else None


def _plain(value):
    """Tuples as lists (a class may declare (8, 1, 1), a flag gives [8, 1, 1])."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _shown(value) -> str:
    """4 rather than 4.0 for a whole float (as the launcher passes it), lists as [8, 1, 1]."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(_plain(value))
