"""Paxloom entry point: experiment class -> Fiddle graph -> mesh -> train or evaluate.

    python main.py --fdl_config=experiments.GPT126M --fdl.PERCORE_BATCH_SIZE=4 --job_log_dir=runs/x

`--fdl.NAME=VALUE` overrides the experiment's hyperparameter NAME; VALUE is a
Python literal (8, 0.5, [1,8,1], "bfloat16"). Mistakes in flags or
hyperparameters print one line and exit with status 2.

Training resumes from the latest checkpoint in --job_log_dir. Exit status: 0 when
training finished, or when SIGTERM/--preemption_signal stopped it after saving a
checkpoint; 2 for a user error; 3 when the loss became NaN/Inf (the last good
checkpoint is kept).
"""

import ast
import os
import sys

from absl import app, flags
from absl import logging as _absl_logging  # noqa: F401  (defines --alsologtostderr, --v, ...)

from runner.errors import UserError

FLAGS = flags.FLAGS
app.define_help_flags()  # --help, -h, --helpfull, as absl programs (and the Pax scripts) have
flags.DEFINE_string("fdl_config", None, "Experiment: experiments.NAME or my_module.MyClass.")
flags.DEFINE_string("job_log_dir", None, "Directory for the resolved config, TensorBoard "
                    "events and checkpoints.")
flags.DEFINE_enum("mode", "train", ["train", "eval"], "train, or evaluate once.")
flags.DEFINE_bool("list_experiments", False, "List the registered experiments and exit.")
flags.DEFINE_bool("print_config", False, "Print the effective hyperparameters and the Fiddle "
                  "graph, then exit.")
flags.DEFINE_string("data_dir", None, "Directory holding pile/ and lambada/ "
                    "(see scripts_gpu/download_the_pile.py).")
flags.DEFINE_string("tfds_data_dir", None, "Alias of --data_dir, the flag the Pax scripts pass.")
flags.DEFINE_string("vocab_path", None, "SentencePiece model; default: $VOCAB_PATH.")
flags.DEFINE_float("peak_tflops", 0.0, "Peak TFLOP/s per device for MFU; default: looked up "
                   "from the device kind.")
# Multi-process (multi-node) jobs, with Pax's flag names; see runner/distributed.py.
flags.DEFINE_bool("multiprocess_gpu", False, "Start jax.distributed; coordinator, process "
                  "count and index come from SLURM/Open MPI/... unless given below.")
flags.DEFINE_string("server_addr", None, "HOST:PORT of process 0's coordinator service.")
flags.DEFINE_integer("num_hosts", None, "Number of processes in the job.")
flags.DEFINE_integer("host_idx", None, "This process's index, 0 .. num_hosts - 1.")
flags.DEFINE_integer("distributed_timeout_s", 300, "Seconds to wait for every process to "
                     "reach the coordinator before failing.")
# Checkpoints and preemption; see runner/checkpoints.py and runner/preemption.py.
flags.DEFINE_string("restore_checkpoint_dir", None, "Start from a checkpoint in this directory "
                    "(a job_log_dir or its checkpoints/): fine-tuning, or --mode=eval of another "
                    "run. New checkpoints still go to --job_log_dir, whose own checkpoints win "
                    "when training and it has some.")
flags.DEFINE_integer("restore_checkpoint_step", None, "Step to restore; default: the latest.")
flags.DEFINE_string("preemption_signal", "SIGUSR1", "Besides SIGTERM, this signal also makes "
                    "training save a checkpoint after the current step and exit 0; 'none' for "
                    "SIGTERM only.")

FDL_PREFIX = "--fdl."


def split_overrides(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Separate `--fdl.NAME=VALUE` arguments (raw VALUE strings) from the other flags."""
    rest, overrides = [], {}
    for arg in argv:
        if not arg.startswith(FDL_PREFIX):
            rest.append(arg)
            continue
        name, eq, value = arg[len(FDL_PREFIX):].partition("=")
        if not eq or not name:
            raise UserError(f"{arg}: write hyperparameter overrides as --fdl.NAME=VALUE")
        overrides[name] = value
    return rest, overrides


def parse_override_values(overrides: dict[str, str], declared: dict[str, type]) -> dict:
    """Raw strings -> Python values. A bare word is accepted for str hyperparameters."""
    values = {}
    for name, raw in overrides.items():
        try:
            values[name] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            if declared.get(name) is str:
                values[name] = raw
            else:
                raise UserError(f"--fdl.{name}={raw}: not a Python literal "
                                f"(e.g. 8, 0.5, [1,8,1], \"bfloat16\")") from None
    return values


def start_distributed() -> None:
    from runner import distributed
    from runner.summaries import log

    options = distributed.DistributedOptions(
        multiprocess_gpu=FLAGS.multiprocess_gpu, server_addr=FLAGS.server_addr,
        num_hosts=FLAGS.num_hosts, host_idx=FLAGS.host_idx,
        timeout_s=FLAGS.distributed_timeout_s)
    if distributed.initialize(options):
        log(distributed.describe())


def main(argv: list[str]) -> int:
    rest, raw_overrides = split_overrides(argv)
    rest = ["--help" if arg == "-h" else arg for arg in rest]  # absl's own short form is -?
    try:
        positional = FLAGS(rest)
    except flags.Error as error:
        raise UserError(str(error)) from None
    if len(positional) > 1:
        raise UserError(f"unexpected argument {positional[1]!r}; flags look like --name=value")

    import experiments

    if FLAGS.list_experiments:
        for name, cls in experiments.registered().items():
            summary = (cls.__doc__ or "").strip().splitlines()[0:1]
            print(f"experiments.{name:<16} {summary[0] if summary else ''}")
        return 0
    if not FLAGS.fdl_config:
        raise UserError("--fdl_config is required (e.g. --fdl_config=experiments.Tiny; "
                        "--list_experiments lists them)")
    cls = experiments.resolve(FLAGS.fdl_config)
    if FLAGS.fdl_config.startswith(experiments.registry.PAX_GPU_CONFIGS + "."):
        print(f"note: --fdl_config={FLAGS.fdl_config} runs Paxloom's "
              f"experiments.{cls.__name__}", file=sys.stderr)
    exp = cls(**parse_override_values(raw_overrides, cls.hyperparameter_types()))

    from runner import job

    # TFDS_DATA_DIR from the environment, as the Pax README passes the data.
    data_dir = FLAGS.data_dir or FLAGS.tfds_data_dir or os.environ.get("TFDS_DATA_DIR")
    vocab_path = FLAGS.vocab_path or os.environ.get("VOCAB_PATH")
    if FLAGS.print_config:
        print(job.describe(exp, data_dir, vocab_path))
        return 0
    if not FLAGS.job_log_dir:
        raise UserError("--job_log_dir is required (where the config, TensorBoard events and "
                        "checkpoints go)")
    start_distributed()  # before any jax device use; after flag checks, so typos fail fast
    job.run(exp, mode=FLAGS.mode, job_log_dir=FLAGS.job_log_dir, data_dir=data_dir,
            vocab_path=vocab_path, peak_tflops=FLAGS.peak_tflops,
            restore_checkpoint_dir=FLAGS.restore_checkpoint_dir,
            restore_checkpoint_step=FLAGS.restore_checkpoint_step,
            preemption_signal=FLAGS.preemption_signal)
    return 0


if __name__ == "__main__":
    from tasks.errors import DataError

    try:
        sys.exit(main(sys.argv))
    except (UserError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except Exception as error:
        # Only a run that got as far as importing the trainer can have diverged.
        trainer = sys.modules.get("runner.trainer")
        if trainer is None or not isinstance(error, trainer.NonFiniteLossError):
            raise
        print(f"error: {error}", file=sys.stderr)
        sys.exit(3)
