"""Paxloom entry point: experiment class -> Fiddle graph -> mesh -> train or evaluate.

    python main.py --fdl_config=experiments.GPT126M --fdl.PERCORE_BATCH_SIZE=4 --job_log_dir=runs/x

`--fdl.NAME=VALUE` overrides the experiment's hyperparameter NAME, and
`--fdl.path.to.field=VALUE` any field of the run's Fiddle graph; VALUE is a Python
literal (8, 0.5, [1,8,1], "bfloat16"). Mistakes in flags or hyperparameters print
one line and exit with status 2. The flags are in paxloom/launch/flags.py.

Training resumes from the latest checkpoint in --job_log_dir. Exit status: 0 when
training finished, or when SIGTERM/Ctrl-C/--preemption_signal stopped it after saving a
checkpoint; 2 for a user error; 3 when the loss became NaN/Inf (the last good
checkpoint is kept); 130 for a Ctrl-C outside the training loop.
"""

import os
import sys
import threading

from absl import flags

from paxloom.core import errors
from paxloom.core.errors import UserError

FLAGS = flags.FLAGS  # defined by paxloom/launch/flags.py, which main() imports


def main(argv: list[str]) -> int:
    # Imported here, not above: a missing dependency (praxis) is then one line, exit 2.
    from experiments import overrides
    from paxloom.launch import flags as launch_flags
    from paxloom.launch import launcher, resolve
    from paxloom.runner.cluster import compilation_cache, xla_flags

    rest, hyperparameter_overrides, graph_overrides = overrides.split(argv)
    launch_flags.parse(rest)
    launch_flags.setup_logging()
    dropped = xla_flags.drop_retired()
    if dropped:
        print(xla_flags.note(dropped), file=sys.stderr)
    xla_flags.check_host_device_count()
    if FLAGS.list_experiments:
        return list_experiments(FLAGS.fdl_config)

    exp, selection = resolve.experiment(resolve.Selection(
        fdl_config=FLAGS.fdl_config, fdl_config_file=FLAGS.fdl_config_file, mode=FLAGS.mode,
        job_log_dir=FLAGS.job_log_dir,
        data_dir=FLAGS.data_dir or FLAGS.tfds_data_dir or os.environ.get("TFDS_DATA_DIR"),
        vocab_path=FLAGS.vocab_path or os.environ.get("VOCAB_PATH"),
        cache_dir=FLAGS.cache_dir, eval_on_test=FLAGS.eval_on_test), hyperparameter_overrides)
    replaced = launcher.note(exp, argv)  # what a scripts_gpu/ launcher set over the class's
    if replaced:
        print(replaced, file=sys.stderr)
    if FLAGS.plan_search and FLAGS.mode != "plan":
        raise UserError("--plan_search searches layouts for --mode=plan; add --mode=plan")
    if FLAGS.mode == "plan" and FLAGS.plan_search:
        from paxloom.launch import plan_search

        print(plan_search.run(
            exp, selection, graph_overrides, device=FLAGS.plan_device,
            compiler=FLAGS.plan_compiler, nodes=FLAGS.plan_nodes,
            global_batch=FLAGS.plan_global_batch, top_k=FLAGS.plan_top_k,
            workers=FLAGS.plan_workers, device_memory_gb=FLAGS.plan_device_memory_gb))
        return 0
    target = None  # this process's devices
    if FLAGS.mode == "plan":
        from paxloom.launch import plan
        from paxloom.runner.planning.plan import target_device

        # Before building the graph starts jax: XLA:GPU's plugin, or as many CPU devices as
        # the mesh has; the graph is built for the GPU planned for, not for this machine.
        target = target_device(FLAGS.plan_device)
        plan_compiler = plan.start(exp, FLAGS.plan_compiler)
    elif FLAGS.print_config:
        from paxloom.core.target import this_process

        # Printed, not run: what only a GPU can run (cuDNN attention, FP8) is shown here too.
        target = this_process(printed=True)
    else:
        if not FLAGS.job_log_dir:
            raise UserError("--job_log_dir is required (where the config, TensorBoard events "
                            "and checkpoints go)")
        # Before anything compiles (jax sets its cache up at the first compilation).
        compilation_cache.enable(FLAGS.jax_compilation_cache_dir)
        # Before anything touches a jax device (building the graph asks for the platform);
        # after the flag checks, so typos fail fast.
        start_distributed()
    config = resolve.run_graph(exp, selection, graph_overrides, target)
    check_profile_steps(config)
    if FLAGS.print_config:
        from paxloom.launch import record

        print(record.config_report(exp, config))
    elif FLAGS.mode == "plan":
        # Re-planned changes keep the command line's graph overrides.
        print(plan.report(
            exp, config,
            lambda variant: resolve.experiment_graph(variant, selection, graph_overrides, target),
            compiler=plan_compiler, device=FLAGS.plan_device, mfu=FLAGS.plan_mfu,
            device_memory_gb=FLAGS.plan_device_memory_gb))
    else:
        run_mode(exp, config, selection)
    return 0


def list_experiments(module: str | None) -> int:
    """The registered experiments, or with --fdl_config=MODULE those of a user's module,
    each with the first sentence of its docstring, wrapped under its own column."""
    import textwrap

    import experiments

    found = (experiments.registry.experiments_in(module) if module else
             {f"experiments.{name}": cls for name, cls in experiments.registered().items()})
    if not found:
        raise UserError(f"--fdl_config={module} defines no experiment (a subclass "
                        f"of experiments.base.BaseExperiment)")
    column = max(map(len, found)) + 1
    for name, cls in found.items():
        print(textwrap.fill(experiments.registry.summary(cls), width=max(100, column + 40),
                            initial_indent=f"{name:<{column}}",
                            subsequent_indent=" " * column, break_on_hyphens=False,
                            break_long_words=False) or name)
    return 0


def start_distributed() -> None:
    from paxloom.core.log import log
    from paxloom.runner.cluster import distributed

    options = distributed.DistributedOptions(
        multiprocess_gpu=FLAGS.multiprocess_gpu, server_addr=FLAGS.server_addr,
        num_hosts=FLAGS.num_hosts, host_idx=FLAGS.host_idx,
        timeout_s=FLAGS.distributed_timeout_s)
    if distributed.initialize(options):
        log(distributed.process_summary())


def check_profile_steps(config) -> None:
    """--profile_start_step must leave a step to trace before the run's last step."""
    start, last = FLAGS.profile_start_step, config.loop.max_steps
    if FLAGS.mode == "train" and start is not None and start >= last:
        raise UserError(f"--profile_start_step={start}: the run ends at step {last}, so "
                        f"nothing would be traced; pick a step below {last}")


def run_mode(exp, config, selection) -> None:
    """--mode=train, eval or decode of the built graph."""
    if FLAGS.should_log_compiles:
        import jax

        jax.config.update("jax_log_compiles", True)
    if FLAGS.mode == "decode":
        from paxloom.launch import decode
        from paxloom.runner.inference.decode import DecodeOptions
        from paxloom.runner.inference.generate import SamplingOptions

        decode.run(exp, config, DecodeOptions(
            job_log_dir=FLAGS.job_log_dir, prompts=FLAGS.prompt,
            prompts_file=FLAGS.prompts_file, max_decode_steps=FLAGS.max_decode_steps,
            sampling=SamplingOptions(temperature=FLAGS.temperature, top_k=FLAGS.top_k,
                                     top_p=FLAGS.top_p, seed=FLAGS.decode_seed),
            batch_size=FLAGS.decode_batch_size, prefill_chunk_len=FLAGS.prefill_chunk_len,
            vocab_path=selection.vocab_path,
            restore_checkpoint_dir=FLAGS.restore_checkpoint_dir,
            restore_checkpoint_step=FLAGS.restore_checkpoint_step))
        return
    from paxloom.launch import job

    job.run(exp, job.RunOptions(
        job_log_dir=FLAGS.job_log_dir, mode=FLAGS.mode, peak_tflops=FLAGS.peak_tflops,
        device_memory_gb=FLAGS.device_memory_gb,
        restore_checkpoint_dir=FLAGS.restore_checkpoint_dir,
        restore_checkpoint_step=FLAGS.restore_checkpoint_step,
        preemption_signal=FLAGS.preemption_signal,
        save_checkpoints=FLAGS.enable_checkpoint_saving,
        skip_broken_checkpoints=FLAGS.skip_broken_checkpoints,
        profiler_port=FLAGS.jax_profiler_port, wandb_project=FLAGS.wandb_project,
        profile_steps=(None if FLAGS.profile_start_step is None else
                       (FLAGS.profile_start_step, FLAGS.profile_num_steps)),
        data_locations=selection.data_locations, hang_timeout_s=FLAGS.hang_timeout_s),
        config=config)


def exit_now(code: int, message: str) -> None:
    """Print the one-line error and end the process at once: a failed background save can
    leave library threads (orbax's) that would otherwise keep the process alive."""
    print(f"error: {message}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cli() -> None:
    """The `paxloom` command (an installed package's entry point) and `python main.py`."""
    try:
        sys.exit(main(sys.argv))
    except UserError as error:
        exit_now(2, errors.message(error))
    except KeyboardInterrupt:
        # Ctrl-C outside the training loop (start-up, compilation, evaluation); in the loop
        # it saves a checkpoint and stops like SIGTERM (paxloom/runner/training/preemption.py).
        exit_now(130, "interrupted (Ctrl-C); run the same command again to resume from the "
                      "last checkpoint")
    except Exception as error:
        watchdog = sys.modules.get("paxloom.runner.training.watchdog")
        if watchdog is not None and watchdog.ENDING.is_set():
            # A peer's end failed this process's collective after its own watchdog fired:
            # the watchdog ends the process, with its line and status.
            threading.Event().wait()
        # Only a run that got as far as importing the training loop can have diverged.
        callbacks = sys.modules.get("paxloom.runner.training.builtin_callbacks")
        if callbacks is None or not isinstance(error, callbacks.NonFiniteLossError):
            raise
        exit_now(3, str(error))


if __name__ == "__main__":
    cli()
