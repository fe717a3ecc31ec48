"""The run record: what a job directory says about the run that wrote it
(hyperparameters.json, fiddle_graph.json/.txt, hyperparameters_history.jsonl), how a rerun,
a decode, an evaluation or an export reads it back, and what --print_config shows.

Beside the hyperparameters, hyperparameters.json records where the data and vocabulary
were, the vocabulary's fingerprint and the run's `origin`: the Hugging Face model its
weights come from (paxloom/runner/state/hf_format.py's `origin`), directly or through the
runs it started from, so that its export gives back that model's own config entries even
when the directory is gone."""

import hashlib
import json
import os
import time

import fiddle as fdl
from fiddle import printing
from fiddle.experimental import serialization

from experiments import pax_compat
from paxloom.core import spec
from paxloom.core.errors import UserError
from paxloom.core.log import log


def config_report(exp, config: fdl.Config) -> str:
    """Effective hyperparameters and the Fiddle graph, as shown by --print_config."""
    hyperparameters = exp.hyperparameters()
    pax_defaults = pax_compat.at_default(hyperparameters)
    unused = exp.unused_hyperparameters()
    lines = [f"# {type(exp).__module__}.{type(exp).__name__}", "", "## Hyperparameters"]
    lines += [f"{name} = {value!r}" for name, value in hyperparameters.items()
              if name not in pax_defaults and name not in unused]
    if unused:
        lines += ["", f"## Not read by {type(exp).__name__}'s model (it builds its own layers; "
                      f"at their defaults)",
                  ", ".join(f"{name}={hyperparameters[name]!r}" for name in unused)]
    lines += ["", "## Pax names at the only value Paxloom accepts (experiments/pax_compat.py)",
              ", ".join(f"{name}={hyperparameters[name]!r}" for name in pax_defaults)]
    lines += ["", "## Batch", spec.batch_layout(config, check=False).summary()]
    lines += ["", "## Model layers", *_layer_classes(config.model, "model")]
    lines += ["", "## Fiddle graph", printing.as_str_flattened(config)]
    return "\n".join(lines)


# The templates that say what the architecture is (others are ops, inits and shardings).
_ARCHITECTURE_TEMPLATES = (
    "lm_tpl", "position_emb_tpl", "separate_embedding_tpl", "softmax_tpl", "final_ln_tpl",
    "stacked_transformer_tpl", "block", "transformer_layer_params_tpl", "ln_tpl",
    "tr_atten_tpl", "tr_fflayer_tpl", "activation_tpl")


def _layer_classes(config: fdl.Buildable, path: str):
    """`path = Class` for the model's architecture templates (the flat listing omits classes)."""
    yield f"{path} = {fdl.get_callable(config).__name__}"
    for name in _ARCHITECTURE_TEMPLATES:
        value = config.__arguments__.get(name)
        if isinstance(value, fdl.Buildable):
            yield from _layer_classes(value, f"{path}.{name}")


def load_config(path: str) -> fdl.Config:
    """A run's graph as write_config recorded it (fiddle_graph.json), to run it again."""
    try:
        with open(path) as f:
            return serialization.load_json(f.read())
    except OSError as error:
        raise UserError(f"--fdl_config_file={path}: {error.strerror}; pass a run's "
                        f"job_log_dir/fiddle_graph.json") from None
    except Exception as error:  # not JSON, or not a Fiddle serialization
        detail = " ".join(str(error).split())[:200]
        raise UserError(f"--fdl_config_file={path} is not a Fiddle graph written by a run "
                        f"({type(error).__name__}: {detail})") from None


def recorded_experiment(graph_path: str) -> tuple[str | None, dict]:
    """(experiment name, hyperparameters) from the hyperparameters.json beside a recorded
    graph, or (None, {}) when there is none."""
    if not os.path.isfile(graph_path):
        raise UserError(f"--fdl_config_file={graph_path}: No such file; pass a run's "
                        f"job_log_dir/fiddle_graph.json")
    path = os.path.join(os.path.dirname(os.path.abspath(graph_path)), "hyperparameters.json")
    if not os.path.isfile(path):
        return None, {}
    record = read_record(path)
    if record is None:
        raise UserError(f"{path} is damaged (not a run's record of its experiment and "
                        f"hyperparameters); pass --fdl_config=experiments.NAME with the "
                        f"run's --fdl.NAME=VALUE overrides, or move the file away")
    return record["experiment"], record["hyperparameters"]


def read_record(path: str) -> dict | None:
    """hyperparameters.json as write_config wrote it, or None when it is damaged."""
    try:
        with open(path, errors="replace") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if (not isinstance(record, dict) or not isinstance(record.get("experiment"), str)
            or not isinstance(record.get("hyperparameters"), dict)):
        return None
    return record


def write_config(job_log_dir: str, exp, config: fdl.Config, extra: dict | None = None) -> None:
    """hyperparameters.json (reload: Cls(**json)), fiddle_graph.json (serialization.load_json)
    and fiddle_graph.txt (for people). `extra`: more keys of hyperparameters.json (run_record)."""
    os.makedirs(job_log_dir, exist_ok=True)
    record = {
        "experiment": f"{type(exp).__module__}.{type(exp).__name__}",
        "hyperparameters": exp.hyperparameters(),
        **(extra or {}),
    }
    with open(os.path.join(job_log_dir, "hyperparameters.json"), "w") as f:
        json.dump(record, f, indent=2)
    with open(os.path.join(job_log_dir, "fiddle_graph.txt"), "w") as f:
        f.write(printing.as_str_flattened(config) + "\n")
    with open(os.path.join(job_log_dir, "fiddle_graph.json"), "w") as f:
        f.write(serialization.dump_json(config, indent=2))


def record_config(job_log_dir: str, exp, config: fdl.Config, resumed_step: int | None,
                  extra: dict | None = None) -> None:
    """Write the run's config (write_config); a resume keeps the run's first record, so it
    still describes the checkpoints, and appends any changed hyperparameters, with the step
    they start at, to hyperparameters_history.jsonl."""
    path = os.path.join(job_log_dir, "hyperparameters.json")
    if resumed_step is None or not os.path.exists(path):
        write_config(job_log_dir, exp, config, extra)
        return
    record = read_record(path)
    if record is None:
        aside = f"{path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
        os.replace(path, aside)
        log(f"warning: {path} is damaged; set aside as {os.path.basename(aside)} and "
            f"written again from this run's hyperparameters")
        write_config(job_log_dir, exp, config, extra)
        return
    recorded = record["hyperparameters"]
    current = json.loads(json.dumps(exp.hyperparameters()))  # as the record holds them
    changed = {name: [recorded.get(name), value] for name, value in current.items()
               if recorded.get(name) != value}
    if changed:
        with open(os.path.join(job_log_dir, "hyperparameters_history.jsonl"), "a") as f:
            f.write(json.dumps({"step": resumed_step, "changed": changed}) + "\n")
        log(f"resuming at step {resumed_step} with changed hyperparameters (appended to "
            f"hyperparameters_history.jsonl): " + ", ".join(
                f"{name} {old!r} -> {new!r}" for name, (old, new) in changed.items()))


# Encoded to fingerprint a vocabulary: two that encode it alike read a checkpoint alike.
_PROBE_TEXT = ("The quick brown fox jumps over the lazy dog. 0123456789 (x, y) = {'a': [1]}\n"
               "Ünïcödé façade — naïve café; def f(self): return None  # tokens")


def tokenizer_fingerprint(tokenizer) -> dict | None:
    """What identifies a text tokenizer (core.data.Tokenizer) for a checkpoint: its
    size, EOS id and a hash of its encoding of a fixed text; None without one."""
    if tokenizer is None:
        return None
    ids = json.dumps([int(i) for i in tokenizer.encode(_PROBE_TEXT)])
    return {"vocab_size": int(tokenizer.vocab_size), "eos_id": int(tokenizer.eos_id),
            "encoding_sha256": hashlib.sha256(ids.encode()).hexdigest()[:16]}


def run_record(data_locations: dict | None, tokenizer, restore_path: str | None = None
               ) -> dict:
    """What hyperparameters.json records beside the hyperparameters: where the data and
    vocabulary were (the flags), the vocabulary's fingerprint and the origin of the
    starting weights at `restore_path` (CHECKPOINT_RESTORE_PATH), when there is one."""
    record = {"data_locations": {k: (os.path.abspath(v) if v else v)
                                 for k, v in (data_locations or {}).items()}}
    fingerprint = tokenizer_fingerprint(tokenizer)
    if fingerprint is not None:
        record["tokenizer"] = fingerprint
    record["origin"] = origin(restore_path)
    return record


def origin(restore_path: str | None, _seen: frozenset = frozenset()) -> dict | None:
    """The Hugging Face model that weights at `restore_path` come from (hf_format.origin):
    that directory itself, or the origin recorded by the Paxloom run it names (its job
    directory, checkpoints/ or one step's directory); None for anything else (no path, a
    Pax checkpoint, a run trained from scratch)."""
    from paxloom.runner.state import hf_format

    if not restore_path or not os.path.isdir(restore_path):
        return None
    if hf_format.is_hf_model_dir(restore_path):
        return hf_format.origin(restore_path)
    path = os.path.abspath(restore_path)
    for where in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        found = os.path.join(where, "hyperparameters.json")
        if os.path.isfile(found):
            run = read_record(found)
            return (None if run is None or found in _seen
                    else recorded_origin(run, _seen | {found}))
    return None


def recorded_origin(run: dict, _seen: frozenset = frozenset()) -> dict | None:
    """The origin of the run whose hyperparameters.json is `run`: the one it recorded, or,
    for a record without one, that of its CHECKPOINT_RESTORE_PATH if it is still there."""
    if "origin" in run:
        return run["origin"]
    return origin(run["hyperparameters"].get("CHECKPOINT_RESTORE_PATH"), _seen)


def recorded_run(directory: str | None) -> dict | None:
    """The hyperparameters.json record of the run in `directory` (a job_log_dir, or its
    checkpoints/), or None when it has none."""
    if not directory:
        return None
    directory = os.path.abspath(directory)
    for where in (directory, os.path.dirname(directory)):
        path = os.path.join(where, "hyperparameters.json")
        if os.path.isfile(path):
            record = read_record(path)
            return None if record is None else {**record, "path": path}
    return None


def check_vocabulary(tokenizer, run_dir: str | None, vocab_path: str | None) -> None:
    """Refuse, in one line, a tokenizer that is not the one the run in `run_dir` trained
    with (its recorded fingerprint): its checkpoint would read the prompts as other words."""
    record = recorded_run(run_dir)
    recorded = (record or {}).get("tokenizer")
    current = tokenizer_fingerprint(tokenizer)
    if not recorded or current is None or current == recorded:
        return
    trained_with = (record.get("data_locations") or {}).get("vocab_path")
    given = f"--vocab_path={vocab_path}" if vocab_path else "this run's vocabulary"
    raise UserError(
        f"{given} ({current['vocab_size']} ids, encoding {current['encoding_sha256']}) is not "
        f"the vocabulary this run trained with ({recorded['vocab_size']} ids, encoding "
        f"{recorded['encoding_sha256']}, recorded in {record['path']}"
        + (f": {trained_with}" if trained_with else "")
        + "); drop --vocab_path to use the recorded one, or pass that one")
