"""The command line's flags (absl), with Pax's names where Pax had the flag, each range
checked by an absl validator as the flags are parsed, whatever the mode, so a typo fails
before any work. main.py reads them; the launcher receives options objects built from
them.

`--help` lists them by group, one line each (GROUPS, which docs/reference/flags.md's sections
follow: tests/test_docs.py); `--helpfull` adds every flag's full help and absl's own flags."""

import logging
import os
import sys

from absl import app, flags
from absl import logging as absl_logging  # also defines --alsologtostderr, --log_dir, -v, ...

from paxloom.core import maxtext_names
from paxloom.core.errors import UserError

FLAGS = flags.FLAGS
flags.DEFINE_string("fdl_config", None, "Experiment: experiments.NAME or my_module.MyClass.")
flags.DEFINE_string("fdl_config_file", None, "Rerun a recorded run: its job_log_dir/"
                    "fiddle_graph.json (the experiment comes from hyperparameters.json beside it "
                    "unless --fdl_config names it).")
flags.DEFINE_string("job_log_dir", None, "Directory for the resolved config, TensorBoard "
                    "events and checkpoints.")
flags.DEFINE_enum("mode", "train", ["train", "eval", "plan", "decode"], "train, evaluate "
                  "once, plan the train step's memory, communication and speed on CPU "
                  "(paxloom/runner/planning/plan.py), or continue prompts from a checkpoint (paxloom/runner/inference/decode.py).")
flags.DEFINE_string("plan_device", "h100", "--mode=plan: the GPU to suggest changes and "
                    "predict speed for: h100, h200, a100-80gb or a100-40gb.")
flags.DEFINE_enum("plan_compiler", "auto", ["auto", "gpu", "cpu"], "--mode=plan: compile "
                  "the step with XLA:GPU for --plan_device without a GPU (gpu; needs the "
                  "plugin `make install` installs), with XLA:CPU on fake devices (cpu), or "
                  "XLA:GPU where installed (auto).")
flags.DEFINE_float("plan_mfu", 0.0, "--mode=plan: the MFU the predicted step time assumes; "
                   "0: the calibrated estimate (compute, recomputation, activations, "
                   "collectives, bubble).")
flags.DEFINE_float("plan_device_memory_gb", 0.0, "--mode=plan: memory of --plan_device in GB "
                   "instead of the table's.")
flags.DEFINE_bool("plan_search", False, "--mode=plan: search the experiment's layouts (mesh, "
                  "remat policy, gradient accumulation, pipeline microbatches, expert axis) "
                  "on --plan_nodes nodes, compile the best --plan_top_k and rank them by "
                  "estimated step time (paxloom/launch/plan_search.py).")
flags.DEFINE_integer("plan_nodes", 0, "--plan_search: nodes of 8 GPUs to lay the run out on; "
                     "0: the experiment's own (the product of DCN_MESH_SHAPE).")
flags.DEFINE_integer("plan_global_batch", 0, "--plan_search: sequences per update; 0: "
                     "PERCORE_BATCH_SIZE x the searched devices.")
flags.DEFINE_integer("plan_top_k", 8, "--plan_search: how many layouts to compile (the best "
                     "by the analytic estimate, with pipelined and expert-parallel ones "
                     "among them where allowed).")
flags.DEFINE_integer("plan_workers", 2, "--plan_search: processes compiling at once (each "
                     "needs a few GB of memory); 1 compiles in this process.")
flags.DEFINE_float("device_memory_gb", 0.0, "Memory one device can give the run, in GB, for "
                   "the check before the first train step (default: the GPU allocator's "
                   "limit; no check on CPU without it).")
flags.DEFINE_bool("list_experiments", False, "List the registered experiments and exit; "
                  "with --fdl_config=MODULE, the experiments that module defines.")
flags.DEFINE_bool("print_config", False, "Print the effective hyperparameters and the Fiddle "
                  "graph, then exit.")
flags.DEFINE_string("data_dir", None, "Directory holding pile/ and lambada/ "
                    "(see scripts_gpu/download_the_pile.py), or paxml's TFDS output "
                    "(the_pile/lm/1.0.0/*.tfrecord*, my_lambada/lm/1.0.0/*.tfrecord*, "
                    "super_glue/boolq/1.0.2/*.tfrecord*).")
flags.DEFINE_string("tfds_data_dir", None, "Alias of --data_dir, the flag the Pax scripts "
                    "pass; default: $TFDS_DATA_DIR.")
flags.DEFINE_string("cache_dir", None, "Where tokenized training data is cached; default: "
                    "$PAXLOOM_TOKEN_CACHE_DIR, else ~/.cache/paxloom/tokenized (never the "
                    "data's own directory).")
flags.DEFINE_string("vocab_path", None, "SentencePiece model; default: $VOCAB_PATH.")
flags.DEFINE_float("peak_tflops", 0.0, "Peak TFLOP/s per device for MFU; default: looked up "
                   "from the device kind.")
# Multi-process (multi-node) jobs, with Pax's flag names; see paxloom/runner/cluster/distributed.py.
flags.DEFINE_bool("multiprocess_gpu", False, "Start jax.distributed; coordinator, process "
                  "count and index come from SLURM/Open MPI/... unless given below.")
flags.DEFINE_string("server_addr", None, "HOST:PORT of process 0's coordinator service.")
flags.DEFINE_integer("num_hosts", None, "Number of processes in the job.")
flags.DEFINE_integer("host_idx", None, "This process's index, 0 .. num_hosts - 1.")
flags.DEFINE_integer("distributed_timeout_s", 300, "Seconds to wait for every process to "
                     "reach the coordinator before failing.")
# Checkpoints and preemption; see paxloom/runner/state/checkpoints.py and paxloom/runner/training/preemption.py.
flags.DEFINE_string("restore_checkpoint_dir", None, "Start from a checkpoint in this directory "
                    "(a job_log_dir or its checkpoints/): fine-tuning, or --mode=eval of another "
                    "run. New checkpoints still go to --job_log_dir, whose own checkpoints win "
                    "when training and it has some.")
flags.DEFINE_integer("restore_checkpoint_step", None, "Step to restore; default: the latest.")
flags.DEFINE_bool("skip_broken_checkpoints", False, "When the checkpoint to restore is "
                  "damaged, restore the newest earlier one (the damaged one is moved to "
                  "checkpoints-broken/, never deleted).")
flags.DEFINE_bool("enable_checkpoint_saving", True, "Save checkpoints (paxml's flag); "
                  "restoring is unaffected.")
# --mode=decode; see paxloom/runner/inference/decode.py.
flags.DEFINE_multi_string("prompt", [], "--mode=decode: a prompt to continue (repeatable).")
flags.DEFINE_string("prompts_file", None, "--mode=decode: prompts to continue, one per line, "
                    "or a .jsonl file of {\"prompt\": ...} objects.")
flags.DEFINE_integer("max_decode_steps", 64, "--mode=decode: most tokens per continuation.")
flags.DEFINE_float("temperature", 0.0, "--mode=decode: 0 decodes greedily; above 0, samples "
                   "at this temperature.")
flags.DEFINE_integer("top_k", 0, "--mode=decode: sample among the k most likely tokens "
                     "(0: all).")
flags.DEFINE_float("top_p", 1.0, "--mode=decode: sample among the most likely tokens that "
                   "hold this much probability (1: all).")
flags.DEFINE_integer("decode_seed", 0, "--mode=decode: seed of the sampling.")
flags.DEFINE_integer("decode_batch_size", 16, "--mode=decode: prompts decoded together.")
flags.DEFINE_integer("prefill_chunk_len", 1024, "--mode=decode: a longer prompt enters the "
                     "KV cache this many tokens at a time (chunked prefill: attention scores "
                     "and activations for one chunk at a time); 0: the whole prompt at once.")
flags.DEFINE_string("preemption_signal", "SIGUSR1", "Besides SIGTERM, this signal also makes "
                    "training save a checkpoint after the current step and exit 0; 'none' for "
                    "SIGTERM only.")
# Evaluation, profiling and compilation logs (paxml's names where paxml had the flag).
flags.DEFINE_bool("eval_on_test", None, "Evaluate during training every EVAL_INTERVAL_STEPS "
                  "(default: as the experiment says; --noeval_on_test: train only).")
flags.DEFINE_integer("jax_profiler_port", None, "Start JAX's profiler server on this port, to "
                     "capture traces on demand from TensorBoard's profile tab.")
flags.DEFINE_integer("profile_start_step", None, "Trace the train steps after this step into "
                     "job_log_dir/tb (TensorBoard profile tab; a Perfetto trace beside it).")
flags.DEFINE_integer("profile_num_steps", 3, "How many steps --profile_start_step traces.")
flags.DEFINE_string("wandb_project", None, "Also log to this Weights & Biases project "
                    "(needs `pip install wandb`; WANDB_MODE=offline works without a network).")
flags.DEFINE_bool("should_log_compiles", False, "Log every JAX compilation (paxml's flag; "
                  "sets jax_log_compiles).")
flags.DEFINE_string("jax_compilation_cache_dir", None, "JAX's persistent compilation cache "
                    "(jax's option and MaxText's jax_cache_dir): compiled programs are kept "
                    "here and a restart loads them instead of compiling, and logs 'loaded "
                    "from the persistent compilation cache'. Default: "
                    "$JAX_COMPILATION_CACHE_DIR if set, else "
                    "$XDG_CACHE_HOME/paxloom/jax_compilation_cache (~/.cache/paxloom/...); "
                    "'none' or '' turns it off (paxloom/runner/cluster/compilation_cache.py).")
flags.DEFINE_float("hang_timeout_s", 3600.0, "End the job (every thread's stack in the log, "
                   "one line, exit status 4) when training makes no progress for this many "
                   "seconds: a stalled step, collective, checkpoint or peer process. Longer "
                   "than the first step's compilation; 0 turns the watchdog off.")

# Other names of flags: --exp is paxml's older name (run_lambada_singlenode.sh passes it).
ALIASES = {"exp": "fdl_config", "compilation_cache_dir": "jax_compilation_cache_dir"}
for _alias, _name in ALIASES.items():
    flags.DEFINE_alias(_alias, _name)

# What `--help` prints: the flags by group, in this order, one line each, and the default where
# it says something. docs/reference/flags.md has a section per group with exactly its flags
# (and their aliases), and every flag defined above is in a group (tests/test_docs.py).
GROUPS: dict[str, dict[str, str]] = {
    "What to run": {
        "fdl_config": "the experiment: experiments.NAME or my_module.MyClass",
        "fdl_config_file": "rerun a recorded run from its job_log_dir/fiddle_graph.json",
        "mode": "train, eval (once), plan (memory, speed) or decode",
        "list_experiments": "list the experiments (of --fdl_config=MODULE) and exit",
        "print_config": "print the hyperparameters and the Fiddle graph, then exit",
    },
    "Where to write": {
        "job_log_dir": "config, TensorBoard events, checkpoints; a rerun resumes there",
        "jax_compilation_cache_dir": "JAX's compile cache; 'none': off",
    },
    "Data": {
        "data_dir": "pile/ and lambada/, your own files, or paxml's TFDS output",
        "tfds_data_dir": "--data_dir as the Pax scripts name it (default: $TFDS_DATA_DIR)",
        "cache_dir": "tokenized data (default: ~/.cache/paxloom/tokenized)",
        "vocab_path": "the tokenizer (default: $VOCAB_PATH)",
    },
    "Checkpoints and evaluation": {
        "restore_checkpoint_dir": "start from another run's checkpoint: fine-tuning, eval",
        "restore_checkpoint_step": "the step to restore (default: the latest)",
        "skip_broken_checkpoints": "restore the newest earlier checkpoint if one is damaged",
        "enable_checkpoint_saving": "save checkpoints",
        "preemption_signal": "on it, save a checkpoint and exit 0, as on SIGTERM",
        "eval_on_test": "evaluate while training (default: as the experiment says)",
    },
    "Memory and hangs": {
        "device_memory_gb": "GB a device can give, checked before step 1; 0: ask it",
        "hang_timeout_s": "end a run stalled for this many seconds; 0: never",
    },
    "Planning (--mode=plan)": {
        "plan_device": "h100, h200, a100-80gb or a100-40gb",
        "plan_compiler": "auto, gpu (XLA:GPU, no GPU needed) or cpu (XLA:CPU)",
        "plan_mfu": "an MFU to assume; 0: the calibrated estimate",
        "plan_device_memory_gb": "GB of --plan_device; 0: the table's",
        "plan_search": "search layouts on --plan_nodes nodes, ranked by step time",
        "plan_nodes": "nodes to search layouts on; 0: the experiment's",
        "plan_global_batch": "sequences per update to search for; 0: as the experiment",
        "plan_top_k": "layouts the search compiles",
        "plan_workers": "processes compiling at once; 1: this one",
    },
    "Decoding (--mode=decode)": {
        "prompt": "a prompt to continue (repeatable)",
        "prompts_file": "prompts, one a line, or .jsonl of {\"prompt\": ...}",
        "max_decode_steps": "most tokens per continuation",
        "temperature": "0: greedy; above 0: sample at this temperature",
        "top_k": "sample among the k likeliest tokens; 0: all",
        "top_p": "keep the likeliest tokens of this total probability",
        "decode_seed": "seed of the sampling",
        "decode_batch_size": "prompts decoded together",
        "prefill_chunk_len": "prompt tokens per prefill chunk; 0: the whole prompt",
    },
    "Several processes": {
        "multiprocess_gpu": "start jax.distributed (SLURM, Open MPI: the rest is found)",
        "server_addr": "HOST:PORT of process 0's coordinator",
        "num_hosts": "processes in the job",
        "host_idx": "this process's index, 0 .. num_hosts - 1",
        "distributed_timeout_s": "seconds to wait for every process to start",
    },
    "Speed, logs and profiles": {
        "peak_tflops": "peak TFLOP/s per device, for MFU; 0: by device kind",
        "jax_profiler_port": "JAX's profiler server, for TensorBoard's profile tab",
        "profile_start_step": "trace the steps after this one into job_log_dir/tb",
        "profile_num_steps": "how many steps --profile_start_step traces",
        "wandb_project": "also log to this Weights & Biases project",
        "should_log_compiles": "log every JAX compilation",
    },
}

USAGE = """\
Usage: paxloom --fdl_config=EXPERIMENT [--fdl.NAME=VALUE ...] [--job_log_dir=DIR] [flags]
       (python main.py takes the same flags)
Example:
  python main.py --fdl_config=experiments.GPT126M --fdl.PERCORE_BATCH_SIZE=4 --job_log_dir=runs/x

--fdl.NAME=VALUE sets the experiment's hyperparameter NAME (--print_config shows them all);
--fdl.path.to.field=VALUE sets any field of the run's Fiddle graph. VALUE is a Python
literal: 8, 0.5, [1,8,1], "bfloat16".
"""


def ungrouped(flag_values: flags.FlagValues = FLAGS) -> list[str]:
    """The flags this module defines that no group of GROUPS (nor ALIASES) lists."""
    grouped = {name for group in GROUPS.values() for name in group} | set(ALIASES)
    mine = flag_values.flags_by_module_dict().get(__name__, [])
    return sorted({flag.name for flag in mine} - grouped)


def help_text(flag_values: flags.FlagValues = FLAGS) -> str:
    """`--help`: USAGE, then every group's flags, one line each."""
    aliases = {name: alias for alias, name in ALIASES.items()}
    groups = dict(GROUPS)
    extra = ungrouped(flag_values)
    if extra:  # a flag not in GROUPS yet (a test fails): still listed
        groups["Other"] = {name: flag_values[name].help.split(". ")[0] for name in extra}
    width = max(len(name) for group in groups.values() for name in group) + 2
    lines = [USAGE]
    for title, group in groups.items():
        lines.append(f"{title}:")
        for name, summary in group.items():
            if name in aliases:
                summary += f" (alias --{aliases[name]})"
            default = flag_values[name].default
            if not (default is None or default is False or default in ("", [])):
                summary += f" (default: {default:g})" if isinstance(default, float) else \
                    f" (default: {default})"
            lines.append(f"  --{name:<{width}}{summary}")
        lines.append("")
    lines += ["absl's flags: --alsologtostderr (library logs), --log_dir=DIR, --flagfile=FILE.",
              "--helpfull: every flag with its full help. docs/reference/flags.md: these groups "
              "in full."]
    return "\n".join(lines) + "\n"


def _print_and_exit(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `paxloom --help | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)


class _HelpFlag(app.HelpFlag):
    """--help and -? (parse() also reads -h as --help): help_text(), then exit 0."""

    def parse(self, arg):
        if self._parse(arg):
            _print_and_exit(help_text())


class _HelpshortFlag(_HelpFlag):
    NAME, SHORT_NAME = "helpshort", None


class _HelpfullFlag(app.HelpfullFlag):
    """--helpfull: USAGE, then absl's full listing (every module's flags), then exit 0."""

    def parse(self, arg):
        if self._parse(arg):
            _print_and_exit(f"{USAGE}\nEvery flag, by the module that defines it:\n"
                            f"{FLAGS.get_help()}\n")


# absl's help flags (--helpxml and the others stay absl's), with Paxloom's help and exit 0.
app.define_help_flags()  # once per process: a later call (absl's app.run) is a no-op
for _name in ("help", "?", "helpshort", "helpfull"):
    delattr(FLAGS, _name)
for _flag in (_HelpFlag(), _HelpshortFlag(), _HelpfullFlag()):
    flags.DEFINE_flag(_flag, module_name="absl.app")


def _check(name: str, ok, expected: str) -> None:
    """An absl validator: --NAME=VALUE must pass `ok` (None passes: the flag is unset)."""
    flags.register_validator(name, lambda v: v is None or ok(v),
                             message=f"must be {expected}")


_check("plan_mfu", lambda v: 0 <= v <= 1, "0 (the calibrated estimate) or a fraction in "
       "(0, 1], e.g. 0.4")
_check("plan_device_memory_gb", lambda v: 0 <= v < float("inf"), "GB >= 0 (0: the table's)")
_check("plan_nodes", lambda v: v >= 0, ">= 0 (0: the experiment's DCN node count)")
_check("plan_global_batch", lambda v: v >= 0, ">= 0 (0: PERCORE_BATCH_SIZE x devices)")
_check("plan_top_k", lambda v: v >= 1, "at least 1")
_check("plan_workers", lambda v: v >= 1, "at least 1 (1: compile in this process)")
_check("device_memory_gb", lambda v: 0 <= v < float("inf"), "GB >= 0 (0: ask the device)")
_check("peak_tflops", lambda v: 0 <= v < float("inf"), ">= 0 (0: looked up from the device)")
_check("num_hosts", lambda v: v >= 1, "at least 1")
_check("distributed_timeout_s", lambda v: v >= 1, "at least 1 second")
_check("restore_checkpoint_step", lambda v: v >= 0, "a step >= 0")
_check("max_decode_steps", lambda v: v >= 1, "at least 1")
_check("temperature", lambda v: 0 <= v < float("inf"), ">= 0 (0 decodes greedily)")
_check("top_k", lambda v: v >= 0, ">= 0 (0 keeps every token)")
_check("top_p", lambda v: 0 < v <= 1, "in (0, 1] (1 keeps every token)")
_check("decode_seed", lambda v: 0 <= v < 2**32, "in 0 .. 2**32 - 1")
_check("decode_batch_size", lambda v: v >= 1, "at least 1")
_check("prefill_chunk_len", lambda v: v >= 0, ">= 0 (0: the whole prompt at once)")
_check("jax_profiler_port", lambda v: 1 <= v <= 65535, "a TCP port, 1 .. 65535")
_check("profile_start_step", lambda v: v >= 0, "a step >= 0")
_check("profile_num_steps", lambda v: v >= 1, "at least 1 step")
_check("hang_timeout_s", lambda v: 0 <= v < float("inf"), ">= 0 seconds (0: no watchdog)")
# Checked once every flag is parsed (absl validates after parsing), so --num_hosts is known.
_check("host_idx", lambda v: 0 <= v < (FLAGS.num_hosts or sys.maxsize),
       "in 0 .. --num_hosts - 1")


def parse(argv: list[str]) -> None:
    """Parse `argv` (program name first) into FLAGS; a bad flag or value is a UserError."""
    argv = ["--help" if arg == "-h" else arg for arg in argv]  # absl's own short form is -?
    try:
        positional = FLAGS(argv)
    except flags.UnrecognizedFlagError as error:
        # MaxText's --per_device_batch_size=4: its Paxloom spelling, not absl's near match.
        found = maxtext_names.hint(error.flagname, _typed_value(error.flagvalue))
        raise UserError(f"unknown flag --{error.flagname}; {found}" if found else
                        _one_line(error)) from None
    except flags.Error as error:
        raise UserError(_one_line(error)) from None
    if len(positional) > 1:
        key, eq, value = positional[1].partition("=")
        found = maxtext_names.hint(key, value) if eq else None  # MaxText's key=value
        raise UserError(f"unexpected argument {positional[1]!r}; "
                        + (found or "flags look like --name=value"))


def _typed_value(arg: str) -> str | None:
    """The VALUE of an `--name=VALUE` argument as typed (None without one)."""
    _, eq, value = arg.partition("=")
    return value if eq else None


def _one_line(error: flags.Error) -> str:
    """absl's message, as `--name=value: what it must be` for a failed validator."""
    text = str(error)
    return text.removeprefix("flag ") if text.startswith("flag --") else text


class _OrbaxInfoFilter(logging.Filter):
    """Leaves out orbax's INFO records: a dozen or more for each checkpoint saved or read
    (its threads, timings and settings), which would bury the run's own lines under the
    --alsologtostderr of every Pax script. Its warnings and errors pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or f"{os.sep}orbax{os.sep}" not in record.pathname


_ORBAX_INFO_FILTER = _OrbaxInfoFilter()


def setup_logging() -> None:
    """absl's conventions: --log_dir writes absl's log files; library INFO logs reach the
    console with --alsologtostderr/--logtostderr or an explicit --verbosity, as in Pax
    (otherwise warnings only, so the console stays Paxloom's own lines); orbax's INFO logs
    only with an explicit --verbosity."""
    absl_logging.use_absl_handler()
    handler = absl_logging.get_absl_handler()
    handler.removeFilter(_ORBAX_INFO_FILTER)
    if not FLAGS["verbosity"].present:
        handler.addFilter(_ORBAX_INFO_FILTER)
    if FLAGS.log_dir:
        try:
            os.makedirs(FLAGS.log_dir, exist_ok=True)
        except OSError as error:
            raise UserError(f"--log_dir={FLAGS.log_dir}: cannot create it "
                            f"({error.strerror})") from None
        absl_logging.get_absl_handler().start_logging_to_file(program_name="paxloom",
                                                              log_dir=FLAGS.log_dir)
    if FLAGS["verbosity"].present:
        return
    # absl's app.run raises its default verbosity (warnings) to INFO once flags are parsed;
    # this entry point parses them itself, so it does that for the flags that ask for logs.
    absl_logging.set_verbosity(absl_logging.INFO if FLAGS.alsologtostderr or FLAGS.logtostderr
                               else absl_logging.WARNING)
