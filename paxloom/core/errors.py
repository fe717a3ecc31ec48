"""The one exception type for mistakes a user can fix: a flag, a hyperparameter, a mesh, a
data file or tokenizer. Its message is one line that names the flag, attribute, file (and
line, where there is one) and says how to fix it, so a user never needs the traceback;
programming errors stay ordinary exceptions and keep theirs."""

import difflib


class UserError(Exception):
    """A problem in the user's input. main.py prints its one-line message and exits 2."""


def near_matches(name: str, candidates) -> str:
    """A ' (did you mean X?)' suffix naming the closest candidates, or ''."""
    by_lower = {str(c).lower(): str(c) for c in candidates}  # learning_rate -> LEARNING_RATE
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(by_lower[c] for c in close) + "?)"


def message(error: BaseException) -> str:
    """The error's own message. Fiddle re-raises an error from inside a graph's build as a
    proxy whose message adds a second 'Fiddle context: ...' paragraph; users get the first."""
    while "proxy_base_exception" in vars(error):
        error = vars(error)["proxy_base_exception"]
    return str(error)


def unknown_name(name: str, candidates, value=None, flag: bool = True) -> str:
    """near_matches for an unknown hyperparameter, flag or field, except that a MaxText
    spelling (per_device_batch_size, REMAT_POLICY) gets its Paxloom equivalent, with `value`
    translated (paxloom/core/maxtext_names.py): ' (MaxText's ... is --fdl.NAME=VALUE ...)'.
    `flag`: written as a command line's `--fdl.NAME=VALUE`, else as a class's `NAME = VALUE`."""
    from paxloom.core import maxtext_names

    found = maxtext_names.hint(name, value, flag)
    return f" ({found})" if found else near_matches(name, candidates)


def unknown_choice(name: str, value, choices, flag: bool = True) -> str:
    """near_matches for a value of hyperparameter `name` that is not one of `choices`, except
    that MaxText's value of the setting it translates (CHECKPOINT_POLICY='full', MaxText's
    remat_policy) gets its Paxloom equivalent."""
    from paxloom.core import maxtext_names

    found = maxtext_names.value_hint(name, value, flag)
    return f" ({found})" if found else near_matches(str(value), choices)
