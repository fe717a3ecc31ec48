"""Several real JAX processes on 127.0.0.1 (CPU devices, gloo collectives) train like one.

Each multi-process job is compared with the same run in this (one) process on its 8
fake CPU devices: the per-step losses and the evaluation must agree to 1e-4.

- main.py end to end under a simulated `srun` (SLURM's environment, no flags), 2 processes
  x 4 devices, DCN [2,1,1] x ICI [1,2,2]: losses and evaluation from the console (process
  0 only), one config and one set of event files.
- this file as the worker program (`python -m tests.test_multiprocess --worker ...`),
  2 processes x 4 devices with FSDP across them (DCN [1,2,1] x ICI [1,4,1]) and
  4 processes x 2 devices (DCN [4,1,1] x ICI [1,2,1]): full-precision losses and
  evaluation from every process, and which batch rows and weight shards each one holds.
- a coordinator that never hears from its peer: exit status 2 and one line naming it.

Every job runs under a deadline and its processes (each in its own process group) are
killed in a `finally`.
"""

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import jax
import pytest

from paxloom.core.errors import UserError
from paxloom.runner.cluster import distributed
from tests.support.processes import (
    DISTRIBUTED_TIMEOUT_S,
    JOB_TIMEOUT_S,
    Job,
    free_port,
    isolated_env,
    main_commands,
    run_job,
)
from tests.support.tiny import fdl_flags, tiny

# The tiny model (tests/support/tiny.py) trained 4 steps with a learning rate that moves the
# weights from step 2 on (step 1 runs at rate 0), evaluated on 2 synthetic batches.
STEPS = 4
RUN = tiny(EVAL_INTERVAL_STEPS=None, PERCORE_BATCH_SIZE=1, LEARNING_RATE=3e-3, LR_COS_WARMUP=1,
           LR_COS_DECAY_START=1, LR_COS_DECAY_END=100, EVAL_BATCHES=2, MAX_STEPS=STEPS)
RTOL = 1e-4


def commands(tmp_path, num, port, **hparams) -> list[list[str]]:
    """main.py on `num` processes, told the job's layout by flags (port None: by srun)."""
    return main_commands(num, "--fdl_config=experiments.base.BaseExperiment",
                         f"--job_log_dir={tmp_path}/job", *fdl_flags(**hparams), port=port)


def srun_envs(num: int, devices: int, port: int) -> list[dict[str, str]]:
    """The environment `srun --ntasks=num` gives each task on one node named 127.0.0.1, plus
    what scripts_gpu/run_pile_multinode.sh exports."""
    return [{**isolated_env(devices), "SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "127.0.0.1",
             "SLURM_NTASKS": str(num), "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i),
             "JAX_COORDINATOR_PORT": str(port),  # jax's port override (else from the job id)
             "JAX_LOCAL_DEVICE_IDS": ",".join(map(str, range(devices)))}
            for i in range(num)]


def worker(tmp_path, num, port, ici, dcn) -> list[list[str]]:
    return [[sys.executable, "-u", "-m", "tests.test_multiprocess", "--worker",
             f"--server_addr=127.0.0.1:{port}", f"--num_hosts={num}", f"--host_idx={i}",
             f"--ici={json.dumps(ici)}", f"--dcn={json.dumps(dcn)}",
             f"--out={tmp_path}/result{i}.json", f"--job_log_dir={tmp_path}/job"]
            for i in range(num)]


# ----- the reference: one process, 8 devices -------------------------------------------


def train_and_evaluate(trainer) -> dict:
    """Per-step losses of STEPS steps from a fresh state, then the evaluation."""
    from tests.support.training import run_steps

    losses, state = run_steps(trainer, STEPS)
    evals = trainer.evaluate(state["params"], STEPS)
    return {"losses": losses, "eval": evals}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    from tests.support.training import make_trainer

    trainer = make_trainer(tmp_path_factory.mktemp("one"), ICI_MESH_SHAPE=[1, 8, 1], **RUN)
    return train_and_evaluate(trainer)


def max_rel_diff(a, b) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


# ----- the tests -------------------------------------------------------------------------


@pytest.mark.slow  # 22 s: two processes under srun
@pytest.mark.process
@pytest.mark.multiprocess
def test_main_py_under_srun_two_processes_dp_across_hosts(tmp_path, one_process):
    # No distributed flags at all: started by (simulated) srun, main.py finds the job's
    # layout in SLURM's environment, as on a cluster.
    port = free_port()
    job = run_job(commands(tmp_path, 2, None, ICI_MESH_SHAPE=[1, 2, 2], DCN_MESH_SHAPE=[2, 1, 1],
                          SUMMARY_INTERVAL_STEPS=1, EVAL_INTERVAL_STEPS=STEPS, **RUN),
                  devices=4, log_dir=tmp_path / "logs", envs=srun_envs(2, 4, port))
    console = job.stdout(0)
    assert (f"jax.distributed: 2 processes, coordinator 127.0.0.1:{port}, 4 local and "
            f"8 global devices") in console
    losses = [float(x) for x in re.findall(r"^step +\d+ \| loss ([\d.]+)", console, re.M)]
    # The console prints 4 decimals: within 5e-5 of the truth, far inside RTOL at loss ~8.
    assert len(losses) == STEPS, console
    print(f"main.py 2x4 DCN[2,1,1] ICI[1,2,2] losses {losses} vs one process "
          f"{one_process['losses']}: max rel diff {max_rel_diff(losses, one_process['losses']):.2e}")
    assert max_rel_diff(losses, one_process["losses"]) < RTOL
    evaluation = re.search(r"eval synthetic_eval \| loss ([\d.]+) \| perplexity [\d.]+ \| "
                           r"accuracy ([\d.]+)", console)
    assert evaluation, console
    expected = one_process["eval"]["synthetic_eval"]
    assert float(evaluation[1]) == pytest.approx(expected["loss"], rel=RTOL, abs=5e-5)
    assert float(evaluation[2]) == pytest.approx(expected["accuracy"], abs=5e-5)
    # Process 1 trains silently; process 0 alone writes the config and the event files.
    assert not re.search(r"^step ", job.stdout(1), re.M), job.stdout(1)
    job_dir = tmp_path / "job"
    assert json.loads((job_dir / "hyperparameters.json").read_text())["hyperparameters"][
        "DCN_MESH_SHAPE"] == [2, 1, 1]
    assert len(list((job_dir / "tb" / "train").glob("events.out.tfevents.*"))) == 1


@pytest.mark.process
@pytest.mark.multiprocess
@pytest.mark.parametrize("num, ici, dcn, rows, weight_rows", [
    # FSDP across processes: each holds half of every weight's `data` dimension.
    (2, [1, 4, 1], [1, 2, 1], [[0, 4], [4, 8]], [[0, 32], [32, 64]]),
    # Data parallel across 4 processes (each a whole replica), FSDP over its 2 devices
    # (slow: the 2x4 case covers processes that train like one).
    pytest.param(4, [1, 2, 1], [4, 1, 1], [[0, 2], [2, 4], [4, 6], [6, 8]], [[0, 64]] * 4,
                 marks=pytest.mark.slow),
], ids=["2x4-fsdp-across", "4x2-dp-across"])
def test_processes_train_and_evaluate_like_one(tmp_path, one_process, num, ici, dcn, rows,
                                               weight_rows):
    port = free_port()
    run_job(worker(tmp_path, num, port, ici, dcn), devices=8 // num, log_dir=tmp_path / "logs")
    results = [json.loads((tmp_path / f"result{i}.json").read_text()) for i in range(num)]
    for i, result in enumerate(results):
        assert (result["process_index"], result["process_count"]) == (i, num)
        assert result["rows"] == rows[i]  # each process loads only its slice of the batch
        # Rows of the FSDP-sharded weight [D=64, F=256] on this process's devices.
        assert result["ffn_rows"] == weight_rows[i]
        diff = max_rel_diff(result["losses"], one_process["losses"])
        print(f"{num}x{8 // num} DCN{dcn} ICI{ici} process {i}: losses {result['losses']} "
              f"vs {one_process['losses']}: max rel diff {diff:.2e}")
        assert diff < RTOL
        # Evaluation outputs are replicated, so every process reads the same metrics.
        for name, value in one_process["eval"]["synthetic_eval"].items():
            assert result["eval"]["synthetic_eval"][name] == pytest.approx(value, rel=RTOL)


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.multiprocess
def test_pipeline_stages_across_two_processes_train_like_one(tmp_path):
    """Two pipeline stages, one per process (the stage axis on DCN), each stage's layers
    split over its process's 4 devices (2 data x 2 model): the same losses as the same
    pipelined mesh in one process."""
    from tests.support.training import make_trainer, train_losses

    pipeline = dict(NUM_MICROBATCHES=2, **RUN)
    expected = train_losses(make_trainer(tmp_path / "one", ICI_MESH_SHAPE=[2, 1, 2, 2],
                                         **pipeline), STEPS)
    port = free_port()
    job = run_job(commands(tmp_path, 2, port, ICI_MESH_SHAPE=[1, 1, 2, 2],
                          DCN_MESH_SHAPE=[2, 1, 1, 1], SUMMARY_INTERVAL_STEPS=1, **pipeline),
                  devices=4, log_dir=tmp_path / "logs")
    console = job.stdout(0)
    losses = [float(x) for x in re.findall(r"^step +\d+ \| loss ([\d.]+)", console, re.M)]
    assert len(losses) == STEPS, console
    print(f"2 processes, stages over DCN: losses {losses} vs one process {expected}")
    assert max_rel_diff(losses, expected) < RTOL


@pytest.mark.process
@pytest.mark.multiprocess
def test_coordinator_without_peers_fails_in_bounded_time_with_one_line(tmp_path):
    port = free_port()
    command = commands(tmp_path, 2, port, **RUN)[0]  # process 0 of 2; process 1 never starts
    command[command.index(f"--distributed_timeout_s={DISTRIBUTED_TIMEOUT_S}")] = (
        "--distributed_timeout_s=3")
    start = time.monotonic()
    job = Job([command], [isolated_env(4)], tmp_path / "logs")
    try:
        codes = job.wait(60)
    finally:
        job.kill()
    elapsed = time.monotonic() - start
    assert codes == [2], job.tails()
    lines = [line for line in job.stderr(0).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: jax.distributed: ")
    assert f"127.0.0.1:{port}" in lines[0] and "--distributed_timeout_s=3" in lines[0]
    assert elapsed < 40  # 3 s of waiting plus imports; not jax's 5-minute default


@pytest.mark.process
@pytest.mark.multiprocess
@pytest.mark.slow  # 15 s; the other two-process tests stay in the quick loop
def test_two_processes_with_the_same_host_idx(tmp_path):
    """The second process to claim an index stops with one line; the job trains."""
    port = free_port()
    first, second = commands(tmp_path, 2, port, **RUN, ICI_MESH_SHAPE=[4, 1, 1],
                            DCN_MESH_SHAPE=[2, 1, 1])
    # Which of the two index-1 processes reports first is a race; exactly one must lose.
    job = Job([second, second, first], [isolated_env(4)] * 3, tmp_path / "logs")
    deadline = time.monotonic() + JOB_TIMEOUT_S
    try:
        while any(p.poll() is None for p in job.procs) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        job.kill()
    codes = [p.returncode for p in job.procs]
    assert sorted(codes[:2]) == [0, 2] and codes[2] == 0, job.tails()
    loser = codes.index(2)
    lines = job.stderr(loser).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: --host_idx=1 is already taken by another process"), lines


# ----- when to start, and flag checks (no processes) -----------------------------------


SRUN = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "node[001-002]", "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}


@pytest.mark.parametrize("options, environ, expected", [
    (distributed.DistributedOptions(), {}, False),
    (distributed.DistributedOptions(multiprocess_gpu=True), {}, True),
    (distributed.DistributedOptions(server_addr="h:1"), {}, True),
    (distributed.DistributedOptions(), SRUN, True),  # srun -n 2 main.py ...
    (distributed.DistributedOptions(), {**SRUN, "SLURM_NTASKS": "1"}, False),
    # sbatch's batch script (no step yet): one copy, not a multi-process job.
    (distributed.DistributedOptions(), {k: v for k, v in SRUN.items()
                                        if k != "SLURM_STEP_NODELIST"}, False),
    (distributed.DistributedOptions(), {"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:1",
                                        "OMPI_COMM_WORLD_SIZE": "4"}, True),
])
def test_when_jax_distributed_starts(options, environ, expected):
    assert distributed.should_initialize(options, environ) is expected


@pytest.mark.parametrize("options, message", [
    (dict(server_addr="node001"), "--server_addr=node001: expected HOST:PORT"),
    (dict(server_addr="node001:http"), "expected HOST:PORT"),
    (dict(num_hosts=0), "--num_hosts=0: must be at least 1"),
    (dict(num_hosts=2, host_idx=2), "--host_idx=2: must be in 0 .. --num_hosts - 1"),
    (dict(multiprocess_gpu=True, timeout_s=0), "--distributed_timeout_s=0"),
])
def test_bad_flags_are_one_line_user_errors(options, message):
    # The checks run before jax.distributed is touched, so this process stays single.
    with pytest.raises(UserError, match=re.escape(message)):
        distributed.initialize(distributed.DistributedOptions(**options), environ={})


def test_flags_reach_jax_and_device_ids_are_left_to_it(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    # No process 0 to hold the --host_idx roll call (tested with real processes above).
    monkeypatch.setattr(distributed.roll_call, "report", lambda *args: None)
    options = distributed.DistributedOptions(server_addr="node001:1234", num_hosts=4,
                                             host_idx=3, timeout_s=42)
    assert distributed.initialize(options, environ={}) is True
    assert calls == [dict(coordinator_address="node001:1234", num_processes=4, process_id=3,
                          # None: jax reads JAX_LOCAL_DEVICE_IDS, else its per-cluster default.
                          local_device_ids=None, initialization_timeout=42)]
    # With only --multiprocess_gpu, jax's cluster detection fills in all three.
    calls.clear()
    distributed.initialize(distributed.DistributedOptions(multiprocess_gpu=True), environ={})
    assert calls[0]["coordinator_address"] is None and calls[0]["num_processes"] is None


@pytest.mark.parametrize("error, message", [
    (ValueError("coordinator_address should be defined."),
     "no cluster environment (SLURM srun, Open MPI mpirun, ...) supplies the job's layout"),
    (RuntimeError("UNKNOWN: Failed to start RPC server\nmore detail"),
     "coordinator node001:1234: UNKNOWN: Failed to start RPC server (if process 0's port"),
])
def test_jax_start_failures_become_one_line_user_errors(monkeypatch, error, message):
    def fail(**kwargs):
        raise error

    monkeypatch.setattr(jax.distributed, "initialize", fail)
    options = distributed.DistributedOptions(multiprocess_gpu=True, server_addr="node001:1234")
    with pytest.raises(UserError, match=re.escape(message)) as raised:
        distributed.initialize(options, environ={})
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("environ, hinted", [
    ({"SLURM_STEP_TASKS_PER_NODE": "1(x8)"}, True),  # srun --ntasks-per-node=1, 8 nodes
    ({"SLURM_STEP_TASKS_PER_NODE": "1(x8)", "JAX_LOCAL_DEVICE_IDS": "0,1,2,3"}, False),
    ({"SLURM_STEP_TASKS_PER_NODE": "8(x2)"}, False),  # one process per GPU: as jax assumes
])
def test_one_gpu_per_node_task_gets_a_hint(monkeypatch, environ, hinted):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "local_device_count", lambda: 1)
    assert ("export JAX_LOCAL_DEVICE_IDS=0,1,...,7" in distributed.process_summary(environ)) is hinted


# ----- the worker program --------------------------------------------------------------


def worker_main(argv: list[str]) -> None:
    """One process of a driver job: start jax.distributed, train, evaluate, write JSON."""
    parser = argparse.ArgumentParser()
    for name in ("server_addr", "ici", "dcn", "out", "job_log_dir"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--num_hosts", type=int, required=True)
    parser.add_argument("--host_idx", type=int, required=True)
    args = parser.parse_args(argv)
    distributed.initialize(distributed.DistributedOptions(
        server_addr=args.server_addr, num_hosts=args.num_hosts, host_idx=args.host_idx,
        timeout_s=DISTRIBUTED_TIMEOUT_S))

    from tests.support.training import make_trainer

    trainer = make_trainer(args.job_log_dir, ICI_MESH_SHAPE=json.loads(args.ici),
                           DCN_MESH_SHAPE=json.loads(args.dcn), **RUN)
    result = train_and_evaluate(trainer)
    ffn = trainer.abstract_state["params"]["lm"]["transformer"]["x_layers_0"]["ff_layer"][
        "ffn_layer1"]["linear"]["w"]
    local_rows = [index[0].indices(ffn.shape[0])[:2] for index in
                  ffn.sharding.addressable_devices_indices_map(ffn.shape).values()]
    result.update(
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        rows=list(trainer.process_rows),
        ffn_rows=[min(a for a, _ in local_rows), max(b for _, b in local_rows)],
        local_devices=jax.local_device_count(),
    )
    assert not math.isnan(result["losses"][-1])
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    import layers  # noqa: F401  # praxis compat patches, as tests/conftest.py does

    worker_main(sys.argv[2:])
