"""Pax's hyperparameter names that Paxloom accepts so that a config copied from paxml runs,
without a model or optimizer of its own behind them: each is accepted at the value Pax's
GPU configs give it and refused otherwise, in one line with the reason. They are declared
(with those defaults) by the `PaxDefaults` group, and --print_config lists them apart."""

import sys

from paxloom.core.errors import UserError

_LRED = ("LR_LRED_* configure Pax's exponential-decay schedule (LinearRampupExponentialDecay), "
         "which Paxloom does not have; set LR_COS_*")

# Pax's LR_SCHEDULE values (paxml c4.py) that Paxloom has: those its GPU configs and scripts
# pass (run_llama_boolq.sh: 'constant' with LoRA, else 'linear_rampup_cosine_decay').
LR_SCHEDULES = ("linear_rampup_cosine_decay", "constant")

# name: (Pax's default, why no other value is accepted)
ACCEPTED_AT_DEFAULT = {
    # paxml TransformerLmSpmdAdam's LR_LRED_* and set_default_adafactor's decay_end.
    "LR_LRED_WARMUP": (4000, _LRED),
    "LR_LRED_DECAY_START": (4001, _LRED),
    "LR_LRED_DECAY_END": (300000, _LRED),
    "LR_LRED_MIN_RATIO": (0.1, _LRED),
    "LR_LRED_MAX": (1.0, _LRED),
    "DECAY_END": (100000, "DECAY_END ends Pax's exponential-decay schedule "
                          "(LinearRampupExponentialDecay), which Paxloom does not have; set "
                          "LR_COS_*"),
    "RELATIVE_BIAS": (False, "praxis's RelativeBias (bucketed relative position bias) is not "
                             "in Paxloom's models"),
    "NORM_POLICY": ("pre", "Paxloom's models are pre-norm only ('pre'; the Hugging Face "
                           "export reads no other)"),
    "ENABLE_DCONV": (False, "Primer's depthwise convolutions on q/k/v (praxis dconv_qkv) are "
                            "not in Paxloom's attention"),
    "TRAINING_OPTIMIZED_SHARDING": (True, "Paxloom always shards for training "
                                          "(set_sharding_params_v1(training_optimized=True) in "
                                          "paxloom/runner/state/partitioning.py)"),
}

# Names a Pax config sets that Pax itself never reads: a class that sets one is accepted
# (a config copied from paxml runs as it is), with a one-line note, and the value ignored.
IGNORED = {
    "R_COS_MIN_RATIO": "a typo in paxml's GPU configs (GPT126M) that Pax never reads (its "
                       "minimum ratio is the inherited LR_COS_MIN_RATIO = 0.1); ignored, as "
                       "Pax ignores it: set LR_COS_MIN_RATIO",
}


def declare_accepted_at_default(group: type) -> None:
    """Declare every ACCEPTED_AT_DEFAULT name on the hyperparameter group `group`: an
    annotated class attribute at its default, as if written in the class body."""
    for name, (default, _) in ACCEPTED_AT_DEFAULT.items():
        group.__annotations__[name] = type(default)
        setattr(group, name, default)


def note_ignored(cls, name: str) -> None:
    """One line on stderr when a class sets an IGNORED name. (Not core.log.log: a class is
    created at import, before jax may start.)"""
    print(f"note: {cls.__module__}.{cls.__name__} sets {name}: {IGNORED[name]}",
          file=sys.stderr)


def check(exp) -> None:
    """LR_SCHEDULE one of LR_SCHEDULES, and every accepted-at-default name at its default,
    or one line naming it and why."""
    if exp.LR_SCHEDULE not in LR_SCHEDULES:
        raise UserError(f"LR_SCHEDULE={exp.LR_SCHEDULE!r}: Paxloom has only praxis's "
                        f"'linear_rampup_cosine_decay' (LR_COS_*) and 'constant' "
                        f"(LEARNING_RATE throughout), not Pax's LinearRampupExponentialDecay "
                        f"(LR_LRED_*)")
    for name, (default, reason) in ACCEPTED_AT_DEFAULT.items():
        value = getattr(exp, name)
        if value != default:
            raise UserError(f"{name}={value!r}: {reason}")


def at_default(hyperparameters: dict) -> list[str]:
    """The accepted-at-default names `hyperparameters` holds at their defaults."""
    return [name for name, (default, _) in ACCEPTED_AT_DEFAULT.items()
            if name in hyperparameters and hyperparameters[name] == default]
