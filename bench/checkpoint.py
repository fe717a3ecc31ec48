"""Checkpoint cost: save (blocking and total), restore, and training slowed by a background save.

    python bench/checkpoint.py [--model small|tiny] [--ici 1,8,1] [--rounds 3] [--dir DIR]

On a CPU machine the script asks for 8 fake devices (as the tests do). It trains a
GPT of --model's size on synthetic data with the Checkpointer that training uses
(paxloom/runner/state/checkpoints.py), and prints:

  blocking   the time `Checkpointer.save` holds the train loop (device-to-host copy)
  total      from the start of a save until orbax has written and renamed it, while
             training goes on, and with nothing else running
  restore    `checkpoints.restore` into the sharded layout, arrays ready
  step time  median train step alone, and of the steps that run while a save is
             still being written in the background (each step timed to completion)

Figures are medians over --rounds saves, the first (warm-up) save excluded. Files go
to a temporary directory (page cache, local disk) unless --dir is given.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
from praxis import pax_fiddle  # noqa: E402

import experiments  # noqa: E402
from paxloom.runner.cluster import mesh as mesh_lib  # noqa: E402
from paxloom.runner.state import checkpoints  # noqa: E402
from paxloom.runner.training.trainer import Trainer  # noqa: E402

MODELS = {
    # ~20M parameters (~240 MB of train state with Adam): a checkpoint big enough to time.
    "small": dict(NUM_LAYERS=4, MODEL_DIMS=512, HIDDEN_DIMS=2048, NUM_HEADS=8, DIMS_PER_HEAD=64,
                  VOCAB_SIZE=8192, MAX_SEQ_LEN=128),
    "tiny": dict(NUM_LAYERS=2, MODEL_DIMS=64, HIDDEN_DIMS=256, NUM_HEADS=8, DIMS_PER_HEAD=8,
                 VOCAB_SIZE=512, MAX_SEQ_LEN=64),
}


def timed_step(trainer, state, data):
    batch = trainer.to_device(data.next_batch())
    start = time.perf_counter()
    with jax.set_mesh(trainer.mesh):
        state, metrics = trainer.train_step(state, batch)
    jax.block_until_ready((state, metrics))
    return state, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--ici", default="1,8,1", help="ICI_MESH_SHAPE, e.g. 8,1,1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", help="where to write checkpoints (default: a temporary dir)")
    args = parser.parse_args()

    ici = [int(x) for x in args.ici.split(",")]
    exp = experiments.BaseExperiment(**MODELS[args.model], ICI_MESH_SHAPE=ici, DATASET="synthetic",
                                     EVAL_INTERVAL_STEPS=0, PERCORE_BATCH_SIZE=1)
    run = pax_fiddle.build(exp.run_config())
    mesh = mesh_lib.create_mesh(run.mesh.ici_mesh_shape, run.mesh.dcn_mesh_shape)
    trainer = Trainer(run, mesh, tempfile.mkdtemp())
    data = trainer.make_train_input()
    state = trainer.init_state()
    for _ in range(3):  # compile, warm up
        state, _ = timed_step(trainer, state, data)
    alone = []
    for _ in range(10):
        state, seconds = timed_step(trainer, state, data)
        alone.append(seconds)

    root = Path(args.dir or tempfile.mkdtemp(prefix="bench_checkpoint_"))
    directory = root / "checkpoints"
    shutil.rmtree(directory, ignore_errors=True)
    blocking, total, total_idle, during = [], [], [], []
    ckpt = checkpoints.Checkpointer(str(directory), metadata={}, every_n_steps=0,
                                    max_to_keep=2)
    for round_ in range(args.rounds + 1):
        label = 2 * round_ + 1  # checkpoint steps must grow; the labels are arbitrary here
        start = time.perf_counter()
        ckpt.save(label, state, data.get_state())
        saved = time.perf_counter()
        steps = []
        while ckpt.writing():  # train on while orbax writes
            state, seconds = timed_step(trainer, state, data)
            steps.append(seconds)
        finished = time.perf_counter()  # to within one step
        ckpt.wait()
        if round_ == 0:
            continue  # the first save also starts orbax's threads and tensorstore
        blocking.append(saved - start)
        total.append(finished - start)
        during.extend(steps)
        # Once more with nothing else running: the write's own duration.
        start = time.perf_counter()
        ckpt.save(label + 1, state, None, final=True)
        total_idle.append(time.perf_counter() - start)
    ckpt.close()
    last = directory / str(checkpoints.latest_step(str(directory)))
    size_mb = sum(f.stat().st_size for f in last.rglob("*") if f.is_file()) / 1e6

    restores = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        restored = checkpoints.restore(str(directory), None, trainer.abstract_state)
        jax.block_until_ready(restored.state)
        restores.append(time.perf_counter() - start)
        del restored

    median = statistics.median
    base = median(alone)
    print(f"model {args.model}: {trainer.num_params / 1e6:.1f}M parameters, train state "
          f"{size_mb:.0f} MB on disk per checkpoint, mesh {dict(mesh.shape)}, "
          f"{jax.devices()[0].platform} x {mesh.devices.size}, {args.rounds} rounds")
    print(f"save blocking      {median(blocking):7.3f} s  (train loop held)")
    print(f"save total         {median(total):7.3f} s  (start -> written and renamed, "
          f"training on)")
    print(f"save total, idle   {median(total_idle):7.3f} s  (the same with no training)")
    print(f"restore            {median(restores):7.3f} s  (into the sharded layout, ready)")
    print(f"step alone         {base:7.3f} s  (median of {len(alone)})")
    if during:
        slow = median(during)
        print(f"step during save   {slow:7.3f} s  (median of {len(during)} steps while "
              f"writing: {100 * (slow / base - 1):+.0f}%)")
    else:
        print("step during save   -  (each save finished before a step did)")
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
