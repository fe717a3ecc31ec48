"""Paxloom entry point: experiment class -> Fiddle graph -> mesh -> train or evaluate.

    python main.py --fdl_config=experiments.GPT126M --fdl.PERCORE_BATCH_SIZE=4 --job_log_dir=runs/x

`--fdl.NAME=VALUE` overrides the experiment's hyperparameter NAME, and
`--fdl.path.to.field=VALUE` any field of the run's Fiddle graph; VALUE is a Python
literal (8, 0.5, [1,8,1], "bfloat16"). Mistakes in flags or hyperparameters print
one line and exit with status 2.

Training resumes from the latest checkpoint in --job_log_dir. Exit status: 0 when
training finished, or when SIGTERM/Ctrl-C/--preemption_signal stopped it after saving a
checkpoint; 2 for a user error; 3 when the loss became NaN/Inf (the last good
checkpoint is kept); 130 for a Ctrl-C outside the training loop.
"""

import json
import os
import sys

from absl import app, flags
from absl import logging as absl_logging  # also defines --alsologtostderr, --log_dir, -v, ...

from core.errors import UserError
from runner.cluster import compilation_cache, xla_flags

FLAGS = flags.FLAGS
app.define_help_flags()  # --help, -h, --helpfull, as absl programs (and the Pax scripts) have
flags.DEFINE_string("fdl_config", None, "Experiment: experiments.NAME or my_module.MyClass.")
flags.DEFINE_alias("exp", "fdl_config")  # paxml's older name, used by run_lambada_singlenode.sh
flags.DEFINE_string("fdl_config_file", None, "Rerun a recorded run: its job_log_dir/"
                    "fiddle_graph.json (the experiment comes from hyperparameters.json beside it "
                    "unless --fdl_config names it).")
flags.DEFINE_string("job_log_dir", None, "Directory for the resolved config, TensorBoard "
                    "events and checkpoints.")
flags.DEFINE_enum("mode", "train", ["train", "eval", "plan", "decode"], "train, evaluate "
                  "once, plan the train step's memory, communication and speed on CPU "
                  "(runner/planning/plan.py), or continue prompts from a checkpoint (runner/inference/decode.py).")
flags.DEFINE_string("plan_device", "h100", "--mode=plan: the GPU to suggest changes and "
                    "predict speed for: h100, h200, a100-80gb or a100-40gb.")
flags.DEFINE_enum("plan_compiler", "auto", ["auto", "gpu", "cpu"], "--mode=plan: compile "
                  "the step with XLA:GPU for --plan_device without a GPU (gpu; needs the "
                  "plugin `make install` installs), with XLA:CPU on fake devices (cpu), or "
                  "XLA:GPU where installed (auto).")
flags.DEFINE_float("plan_mfu", 0.4, "--mode=plan: the MFU the predicted step time assumes.")
flags.DEFINE_float("plan_device_memory_gb", 0.0, "--mode=plan: memory of --plan_device in GB "
                   "instead of the table's.")
flags.DEFINE_bool("list_experiments", False, "List the registered experiments and exit.")
flags.DEFINE_bool("print_config", False, "Print the effective hyperparameters and the Fiddle "
                  "graph, then exit.")
flags.DEFINE_string("data_dir", None, "Directory holding pile/ and lambada/ "
                    "(see scripts_gpu/download_the_pile.py), or paxml's TFDS output "
                    "(the_pile/lm/1.0.0/*.tfrecord*, my_lambada/lm/1.0.0/*.tfrecord*).")
flags.DEFINE_string("tfds_data_dir", None, "Alias of --data_dir, the flag the Pax scripts "
                    "pass; default: $TFDS_DATA_DIR.")
flags.DEFINE_string("cache_dir", None, "Where tokenized training data is cached; default: "
                    "beside the data when writable, else ~/.cache/paxloom.")
flags.DEFINE_string("vocab_path", None, "SentencePiece model; default: $VOCAB_PATH.")
flags.DEFINE_float("peak_tflops", 0.0, "Peak TFLOP/s per device for MFU; default: looked up "
                   "from the device kind.")
# Multi-process (multi-node) jobs, with Pax's flag names; see runner/cluster/distributed.py.
flags.DEFINE_bool("multiprocess_gpu", False, "Start jax.distributed; coordinator, process "
                  "count and index come from SLURM/Open MPI/... unless given below.")
flags.DEFINE_string("server_addr", None, "HOST:PORT of process 0's coordinator service.")
flags.DEFINE_integer("num_hosts", None, "Number of processes in the job.")
flags.DEFINE_integer("host_idx", None, "This process's index, 0 .. num_hosts - 1.")
flags.DEFINE_integer("distributed_timeout_s", 300, "Seconds to wait for every process to "
                     "reach the coordinator before failing.")
# Checkpoints and preemption; see runner/state/checkpoints.py and runner/training/preemption.py.
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
# --mode=decode; see runner/inference/decode.py.
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
                    "'none' or '' turns it off (runner/cluster/compilation_cache.py).")
flags.DEFINE_alias("compilation_cache_dir", "jax_compilation_cache_dir")


def resolve_experiment(hyperparameter_overrides: dict[str, str]):
    """The experiment instance, from --fdl_config, or from the record of --fdl_config_file."""
    import experiments
    from experiments import overrides

    name = FLAGS.fdl_config
    recorded = {}
    if FLAGS.fdl_config_file:
        from launch import job

        if hyperparameter_overrides:
            raise UserError(f"--fdl_config_file reruns a recorded graph, so --fdl."
                            f"{next(iter(hyperparameter_overrides))} cannot change it; "
                            f"override the graph's fields (--fdl.loop.max_steps=...) instead")
        recorded_name, recorded = job.recorded_experiment(FLAGS.fdl_config_file)
        name = name or recorded_name
    run_record = recorded_run(name)
    if run_record:
        name = name or run_record["experiment"]
    if not name:
        raise UserError("--fdl_config is required (e.g. --fdl_config=experiments.Tiny; "
                        "--list_experiments lists them)")
    cls = experiments.resolve(name)
    if name.startswith(experiments.registry.PAX_GPU_CONFIGS + "."):
        print(f"note: --fdl_config={name} runs Paxloom's experiments.{cls.__name__}",
              file=sys.stderr)
    if FLAGS.fdl_config_file:
        return cls(**{k: v for k, v in recorded.items() if k in cls.hyperparameter_types()})
    values = overrides.hyperparameter_values(hyperparameter_overrides, cls.hyperparameter_types())
    if run_record:
        values = use_recorded_settings(cls, run_record, values)
    return cls(**values)


# --mode=decode/eval of a trained run: the data locations its hyperparameters.json recorded.
_RECORDED_LOCATIONS: dict = {}


def recorded_run(name: str | None) -> dict | None:
    """--mode=decode and --mode=eval without --fdl_config_file: the record of the run in
    --job_log_dir, when it holds one of the experiment named (or none is named)."""
    if FLAGS.mode not in ("decode", "eval") or FLAGS.fdl_config_file or not FLAGS.job_log_dir:
        return None
    import experiments
    from launch import job

    record = job.recorded_run(FLAGS.job_log_dir)
    if record is None or not os.path.samefile(os.path.dirname(record["path"]),
                                              FLAGS.job_log_dir):
        return None
    try:
        if name and experiments.resolve(name) is not experiments.resolve(record["experiment"]):
            return None  # another experiment's evaluation of this run (Lambada126M)
    except UserError:
        return None
    return record


def use_recorded_settings(cls, record: dict, values: dict) -> dict:
    """The recorded run's hyperparameters and data locations under the command line's: a
    run decodes and evaluates as it trained unless a flag says otherwise. Logs one line."""
    from core.log import log

    types, defaults = cls.hyperparameter_types(), cls().hyperparameters()
    recorded = {k: v for k, v in record["hyperparameters"].items()
                if k in types and k not in values}
    used = [f"{k}={v!r}" for k, v in recorded.items()
            if json.dumps(v) != json.dumps(defaults.get(k))]
    given = {"data_dir": data_dir(), "vocab_path": vocab_path(), "cache_dir": FLAGS.cache_dir}
    for key, value in (record.get("data_locations") or {}).items():
        if value and not given.get(key):
            _RECORDED_LOCATIONS[key] = value
            used.append(f"--{key}={value}")
    if used:
        log(f"using the run's recorded settings ({record['path']}): {', '.join(used)} "
            f"(flags override them)")
    return {**recorded, **values}


def data_dir() -> str | None:
    return (FLAGS.data_dir or FLAGS.tfds_data_dir or os.environ.get("TFDS_DATA_DIR")
            or _RECORDED_LOCATIONS.get("data_dir"))


def vocab_path() -> str | None:
    return (FLAGS.vocab_path or os.environ.get("VOCAB_PATH")
            or _RECORDED_LOCATIONS.get("vocab_path"))


def data_locations() -> dict:
    """Where this command line says the data live (recorded in hyperparameters.json)."""
    return {"data_dir": data_dir(), "vocab_path": vocab_path(),
            "cache_dir": FLAGS.cache_dir or _RECORDED_LOCATIONS.get("cache_dir")}


def run_graph(exp, graph_overrides: dict[str, str]):
    """The run's Fiddle graph: the experiment's (or the recorded one), as the flags adjust it."""
    from experiments import overrides
    from launch import job

    if not FLAGS.fdl_config_file:
        config = experiment_graph(exp, graph_overrides)
    else:
        config = job.load_config(FLAGS.fdl_config_file)
        overrides.apply_to_graph(config, graph_overrides, exp.hyperparameter_types())
    if FLAGS.eval_on_test is not None:
        job.set_eval_during_training(config, FLAGS.eval_on_test)
    return config


def experiment_graph(exp, graph_overrides: dict[str, str]):
    """`exp`'s run graph for this command line: data and tokenizer from the flags (and
    TFDS_DATA_DIR, as the Pax README passes the data), with its --fdl.path overrides."""
    from experiments import overrides

    # A plan chooses the attention kernel for the GPU it plans for, not for this CPU.
    planned = {}
    if FLAGS.mode == "plan":
        from runner.planning import plan

        planned["plan_for_hopper"] = plan.DEVICE_KINDS.get(FLAGS.plan_device,
                                                           plan.DEVICE_KINDS["h100"]).hopper
    config = exp.run_config(
        data_dir=data_dir(), vocab_path=vocab_path(),
        cache_dir=data_locations()["cache_dir"], **planned)
    overrides.apply_to_graph(config, graph_overrides, exp.hyperparameter_types())
    return config


def start_distributed() -> None:
    from core.log import log
    from runner.cluster import distributed

    options = distributed.DistributedOptions(
        multiprocess_gpu=FLAGS.multiprocess_gpu, server_addr=FLAGS.server_addr,
        num_hosts=FLAGS.num_hosts, host_idx=FLAGS.host_idx,
        timeout_s=FLAGS.distributed_timeout_s)
    if distributed.initialize(options):
        log(distributed.describe())


# Flags with a range: (flag, the test a value passes, the range in words). Checked as soon as
# the flags are parsed, whatever the mode, so a typo fails before any work.
_RANGES = [
    ("plan_mfu", lambda v: 0 < v <= 1, "a fraction in (0, 1], e.g. 0.4"),
    ("plan_device_memory_gb", lambda v: 0 <= v < float("inf"), "GB >= 0 (0: the table's)"),
    ("peak_tflops", lambda v: 0 <= v < float("inf"), ">= 0 (0: looked up from the device)"),
    ("num_hosts", lambda v: v >= 1, "at least 1"),
    ("host_idx", lambda v: 0 <= v < (FLAGS.num_hosts or sys.maxsize),
     "in 0 .. --num_hosts - 1"),
    ("distributed_timeout_s", lambda v: v >= 1, "at least 1 second"),
    ("restore_checkpoint_step", lambda v: v >= 0, "a step >= 0"),
    ("max_decode_steps", lambda v: v >= 1, "at least 1"),
    ("temperature", lambda v: 0 <= v < float("inf"), ">= 0 (0 decodes greedily)"),
    ("top_k", lambda v: v >= 0, ">= 0 (0 keeps every token)"),
    ("top_p", lambda v: 0 < v <= 1, "in (0, 1] (1 keeps every token)"),
    ("decode_seed", lambda v: 0 <= v < 2**32, "in 0 .. 2**32 - 1"),
    ("decode_batch_size", lambda v: v >= 1, "at least 1"),
    ("jax_profiler_port", lambda v: 1 <= v <= 65535, "a TCP port, 1 .. 65535"),
    ("profile_start_step", lambda v: v >= 0, "a step >= 0"),
    ("profile_num_steps", lambda v: v >= 1, "at least 1 step"),
]


def check_flag_ranges() -> None:
    """Every flag with a range, in one line each (UserError: exit status 2)."""
    for name, ok, expected in _RANGES:
        value = FLAGS[name].value
        if value is not None and not ok(value):
            raise UserError(f"--{name}={value}: must be {expected}")


def check_profile_steps(config) -> None:
    """--profile_start_step must leave a step to trace before the run's last step."""
    start, last = FLAGS.profile_start_step, config.loop.max_steps
    if FLAGS.mode == "train" and start is not None and start >= last:
        raise UserError(f"--profile_start_step={start}: the run ends at step {last}, so "
                        f"nothing would be traced; pick a step below {last}")


def setup_logging() -> None:
    """absl's conventions: --log_dir writes absl's log files; library INFO logs reach the
    console with --alsologtostderr/--logtostderr or an explicit --verbosity, as in Pax
    (otherwise warnings only, so the console stays Paxloom's own lines)."""
    absl_logging.use_absl_handler()
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


def main(argv: list[str]) -> int:
    from experiments import overrides

    rest, hyperparameter_overrides, graph_overrides = overrides.split(argv)
    rest = ["--help" if arg == "-h" else arg for arg in rest]  # absl's own short form is -?
    try:
        positional = FLAGS(rest)
    except flags.Error as error:
        raise UserError(str(error)) from None
    if len(positional) > 1:
        raise UserError(f"unexpected argument {positional[1]!r}; flags look like --name=value")
    check_flag_ranges()
    setup_logging()
    dropped = xla_flags.drop_retired()
    if dropped:
        print(xla_flags.note(dropped), file=sys.stderr)

    if FLAGS.list_experiments:
        import experiments

        for name, cls in experiments.registered().items():
            summary = (cls.__doc__ or "").strip().splitlines()[0:1]
            print(f"experiments.{name:<16} {summary[0] if summary else ''}")
        return 0
    exp = resolve_experiment(hyperparameter_overrides)
    if FLAGS.mode == "plan":
        from runner.planning import plan

        # Before building the graph starts jax: XLA:GPU's plugin, or as many CPU devices as
        # the mesh has.
        plan_compiler = plan.start(exp, FLAGS.plan_compiler)
    elif not FLAGS.print_config:
        if not FLAGS.job_log_dir:
            raise UserError("--job_log_dir is required (where the config, TensorBoard events "
                            "and checkpoints go)")
        # Before anything compiles (jax sets its cache up at the first compilation).
        compilation_cache.enable(FLAGS.jax_compilation_cache_dir)
        # Before anything touches a jax device (building the graph asks for the platform);
        # after the flag checks, so typos fail fast.
        start_distributed()
    config = run_graph(exp, graph_overrides)
    check_profile_steps(config)
    if FLAGS.print_config:
        from launch import job

        print(job.describe(exp, config))
    elif FLAGS.mode == "plan":
        # Re-planned changes keep the command line's graph overrides.
        print(plan.report(exp, config, lambda variant: experiment_graph(variant, graph_overrides),
                          compiler=plan_compiler, device=FLAGS.plan_device, mfu=FLAGS.plan_mfu,
                          device_memory_gb=FLAGS.plan_device_memory_gb))
    else:
        run_mode(exp, config)
    return 0


def run_mode(exp, config) -> None:
    """--mode=train, eval or decode of the built graph."""
    if FLAGS.should_log_compiles:
        import jax

        jax.config.update("jax_log_compiles", True)
    if FLAGS.mode == "decode":
        from launch import decode
        from runner.inference.decode import DecodeOptions
        from runner.inference.generate import SamplingOptions

        decode.run(exp, config, DecodeOptions(
            job_log_dir=FLAGS.job_log_dir, prompts=FLAGS.prompt,
            prompts_file=FLAGS.prompts_file, max_decode_steps=FLAGS.max_decode_steps,
            sampling=SamplingOptions(temperature=FLAGS.temperature, top_k=FLAGS.top_k,
                                     top_p=FLAGS.top_p, seed=FLAGS.decode_seed),
            batch_size=FLAGS.decode_batch_size, vocab_path=vocab_path(),
            restore_checkpoint_dir=FLAGS.restore_checkpoint_dir,
            restore_checkpoint_step=FLAGS.restore_checkpoint_step))
        return
    from launch import job

    job.run(exp, job.RunOptions(
        job_log_dir=FLAGS.job_log_dir, mode=FLAGS.mode, peak_tflops=FLAGS.peak_tflops,
        restore_checkpoint_dir=FLAGS.restore_checkpoint_dir,
        restore_checkpoint_step=FLAGS.restore_checkpoint_step,
        preemption_signal=FLAGS.preemption_signal,
        save_checkpoints=FLAGS.enable_checkpoint_saving,
        skip_broken_checkpoints=FLAGS.skip_broken_checkpoints,
        profiler_port=FLAGS.jax_profiler_port, wandb_project=FLAGS.wandb_project,
        profile_steps=(None if FLAGS.profile_start_step is None else
                       (FLAGS.profile_start_step, FLAGS.profile_num_steps)),
        data_locations=data_locations()), config=config)


def exit_now(code: int, message: str) -> None:
    """Print the one-line error and end the process at once: a failed background save can
    leave library threads (orbax's) that would otherwise keep the process alive."""
    print(f"error: {message}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    from core import errors
    from core.errors import UserError

    try:
        sys.exit(main(sys.argv))
    except UserError as error:
        exit_now(2, errors.message(error))
    except KeyboardInterrupt:
        # Ctrl-C outside the training loop (start-up, compilation, evaluation); in the loop
        # it saves a checkpoint and stops like SIGTERM (runner/training/preemption.py).
        exit_now(130, "interrupted (Ctrl-C); run the same command again to resume from the "
                      "last checkpoint")
    except Exception as error:
        # Only a run that got as far as importing the training loop can have diverged.
        callbacks = sys.modules.get("runner.training.callbacks")
        if callbacks is None or not isinstance(error, callbacks.NonFiniteLossError):
            raise
        exit_now(3, str(error))
