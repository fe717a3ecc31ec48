"""The command lines of paxml's four GPU launch scripts, run as they are.

Written out from paxml/contrib/gpu/scripts_gpu/ (run_pile_singlenode.sh,
run_lambada_singlenode.sh, run_pile_multinode.sh, example_slurm_pile.sub): the same
flags and environment variables, `python3 -u -m paxml.main` replaced by this repo's
main.py, on a TFDS-layout data directory as paxml's download scripts write it. Two
changes make them run on a 2-core CPU: the tiny model's --fdl. overrides are appended,
and the multi-node job's coordinator port is a free one instead of 12345.
"""

import re

import pytest

from tests.support.data import make_tfds_data
from tests.support.processes import (
    DISTRIBUTED_TIMEOUT_S,
    free_port,
    isolated_env,
    main_command,
    run_job,
)
from tests.support.tiny import SHORT_PILE_RUN, tiny_flags

# The scripts' BASE_XLA_FLAGS, verbatim: several are gone from today's XLA, which would
# abort on them; main.py drops exactly those with a note.
PAX_XLA_FLAGS = (
    "--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_triton_gemm=false "
    "--xla_gpu_simplify_all_fp_conversions --xla_gpu_enable_async_all_gather=true "
    "--xla_gpu_enable_async_reduce_scatter=true  --xla_gpu_enable_highest_priority_async_stream=true "
    "--xla_gpu_enable_triton_softmax_fusion=false  --xla_gpu_all_reduce_combine_threshold_bytes=51200 "
    "--xla_gpu_graph_level=0 --xla_gpu_enable_async_all_reduce=true")
CONFIGS = "paxml.contrib.gpu.scripts_gpu.configs"
# The tiny model (same shapes for training and the Lambada evaluation of its checkpoint).
TINY_OVERRIDES = tiny_flags(**SHORT_PILE_RUN, FPROP_DTYPE=None, LAMBADA_MAX_EXAMPLES=8,
                            CHECKPOINT_EVERY_N_STEPS=4)


@pytest.fixture(scope="module")
def pax_data(tmp_path_factory):
    """TFDS_DATA_DIR with the_pile and my_lambada, and a SentencePiece model."""
    data_dir, vocab, _, _ = make_tfds_data(tmp_path_factory.mktemp("pax"), num_train=220,
                                           num_passages=8, seed=11)
    return data_dir, vocab


def pax_env(devices: int, **extra) -> dict[str, str]:
    env = isolated_env(devices)
    env["XLA_FLAGS"] = f"{PAX_XLA_FLAGS} {env['XLA_FLAGS']}"  # export XLA_FLAGS="$BASE ${XLA_FLAGS}"
    return {**env, **extra}


@pytest.mark.slow  # 30 s: two of Pax's scripts end to end
@pytest.mark.process
def test_singlenode_pile_then_lambada_scripts(pax_data, tmp_path):
    tfds_data_dir, vocab = pax_data
    log_dir = tmp_path / "test_logdir"
    # run_pile_singlenode.sh TFDS_DATA_DIR VOCAB_PATH float32 8 1 LOG_DIR
    pile = main_command(f"--job_log_dir={log_dir}",
                        f"--fdl_config={CONFIGS}.Pile126M",
                        '--fdl.FPROP_DTYPE="float32"',
                        "--fdl.ICI_MESH_SHAPE=[8, 1, 1]",
                        "--fdl.DCN_MESH_SHAPE=[1,1,1]",
                        "--fdl.PERCORE_BATCH_SIZE=1",
                        f"--tfds_data_dir={tfds_data_dir}",
                        "--alsologtostderr", *TINY_OVERRIDES, unbuffered=True)
    job = run_job([pile], 8, tmp_path / "pile_logs",
                  envs=[pax_env(8, VOCAB_PATH=str(vocab))])
    out, err = job.stdout(0), job.stderr(0)
    assert "step      4 | loss" in out and "eval lambada | accuracy" in out
    assert "note: ignoring XLA_FLAGS that this XLA no longer has" in err
    # --alsologtostderr: the libraries' Python INFO logs through absl's handler, as in Pax,
    # but orbax's (tests/test_main_cli.py); C++ INFO lines, "I0000 ...", print without any flag.
    assert re.search(r"^I\d{4} [\d:.]+ +\d+ \w+\.py:\d+\] ", err, re.M), err[-3000:]
    assert f"note: --fdl_config={CONFIGS}.Pile126M runs Paxloom's experiments.Pile126M" in err

    # run_lambada_singlenode.sh TFDS_DATA_DIR VOCAB_PATH LOG_DIR (no XLA_FLAGS of its own)
    lambada = main_command(f"--job_log_dir={log_dir}",
                           f"--exp={CONFIGS}.Lambada126M",
                           f"--tfds_data_dir={tfds_data_dir}",
                           "--mode=eval",
                           "--should_log_compiles=True",
                           "--alsologtostderr", *TINY_OVERRIDES)
    job = run_job([lambada], 8, tmp_path / "lambada_logs",
                  envs=[isolated_env(8, VOCAB_PATH=str(vocab))])
    assert "evaluating step 4" in job.stdout(0)
    assert "eval lambada | accuracy" in job.stdout(0)
    assert "Finished XLA compilation" in job.stderr(0)  # --should_log_compiles
    assert (log_dir / "lambada_predictions.jsonl").is_file()


@pytest.mark.process
@pytest.mark.multiprocess
@pytest.mark.slow  # two processes under Pax's .sub; the single-node scripts run in make test
def test_multinode_script_under_the_slurm_sub(pax_data, tmp_path):
    """run_pile_multinode.sh's command as example_slurm_pile.sub starts it: srun with one task
    per GPU (`--ntasks-per-node=8` there; 2 nodes x 2 tasks of 1 device here), each task
    with --num_hosts=$SLURM_NTASKS --host_idx=$SLURM_PROCID and the DCN mesh over nodes,
    in the environment the .sub exports (TFDS_DATA_DIR, WORKSPACE_DIR, GPT_VOCAB_PATH)."""
    tfds_data_dir, vocab = pax_data
    port = free_port()
    nodes, tasks_per_node = 2, 2
    num_gpus = tasks_per_node  # run_pile_multinode.sh's NUM_GPUS: the GPUs of a node
    commands, envs = [], []
    for rank in range(nodes * tasks_per_node):
        commands.append(main_command(
            f"--job_log_dir={tmp_path}/workspace/pile_126m",  # the .sub's workspace/${LOG_DIR_LOCAL}
            f"--fdl_config={CONFIGS}.Pile126M",
            f"--tfds_data_dir={tfds_data_dir}",
            '--fdl.FPROP_DTYPE="float32"',
            f"--fdl.ICI_MESH_SHAPE=[{num_gpus},1,1]",
            f"--fdl.DCN_MESH_SHAPE=[{nodes},1,1]",
            "--fdl.PERCORE_BATCH_SIZE=2",
            "--multiprocess_gpu",
            f"--server_addr=127.0.0.1:{port}",
            f"--num_hosts={nodes * tasks_per_node}",
            f"--host_idx={rank}",
            "--alsologtostderr", f"--distributed_timeout_s={DISTRIBUTED_TIMEOUT_S}",
            *TINY_OVERRIDES, unbuffered=True))
        envs.append(pax_env(
            1, VOCAB_PATH=str(vocab), XLA_PYTHON_CLIENT_MEM_FRACTION="0.85",
            SLURM_JOB_NUM_NODES=str(nodes), SLURM_LAUNCH_NODE_IPADDR="127.0.0.1",
            SLURM_NTASKS=str(nodes * tasks_per_node), SLURM_PROCID=str(rank),
            SLURM_NODEID=str(rank // tasks_per_node),
            TFDS_DATA_DIR=str(tfds_data_dir), WORKSPACE_DIR=str(tmp_path / "workspace"),
            GPT_VOCAB_PATH=str(vocab.parent), PWD=str(tmp_path)))
    job = run_job(commands, 1, tmp_path / "logs", envs=envs)
    assert "jax.distributed: 4 processes" in job.stdout(0)
    assert "step      4 | loss" in job.stdout(0)
    assert "eval lambada | accuracy" in job.stdout(0)
