"""The training loop's callback protocol (paxloom/core/callbacks.py): each callback's
every_n_steps, save and stop requests, the order of the hooks, published scalars."""

import pytest

from paxloom.core.callbacks import Callback, Request
from paxloom.runner.training.builtin_callbacks import ConsoleSummaries
from tests.support.training import make_trainer

pytestmark = pytest.mark.usefixtures("compilation_cache")


class Recorder(Callback):
    def __init__(self, every=1, stop_at=None, save_at=()):
        self.every_n_steps, self.stop_at, self.save_at = every, stop_at, save_at
        self.events = []

    def on_start(self, run):
        self.events.append(("start", run.start_step))

    def after_step(self, info):
        self.events.append(("step", info.step))
        if info.step == self.stop_at:
            return Request(stop=True, reason="enough")
        return Request(save=info.step in self.save_at)

    def on_save(self, info, final):
        self.events.append(("save", info.step, final))

    def on_scalars(self, split, step, scalars):
        if "loss" in scalars:
            self.events.append(("scalars", split, step))

    def after_evaluation(self, step, results):
        self.events.append(("evaluated", step, sorted(results)))

    def on_end(self, info):
        self.events.append(("end", info.step))


def test_hooks_in_order_with_every_n_steps_saves_and_a_stop(tmp_path, capsys):
    trainer = make_trainer(tmp_path, MAX_STEPS=8, SUMMARY_INTERVAL_STEPS=4, EVAL_INTERVAL_STEPS=2,
                           EVAL_BATCHES=1)
    every_step = Recorder(save_at=(2,))
    every_third = Recorder(every=3, stop_at=6)
    trainer.train(callbacks=[ConsoleSummaries(), every_step, every_third])
    # Every third step (and the stopping one); a save any callback requested reaches all.
    assert every_third.events == [
        ("start", 0), ("evaluated", 2, ["synthetic_eval"]), ("save", 2, False), ("step", 3),
        ("scalars", "train", 4), ("evaluated", 4, ["synthetic_eval"]), ("step", 6),
        ("save", 6, True), ("end", 6)]
    # Every step; the summary published by the callback before it; the stop ends the loop
    # before step 6's evaluation, with a final save.
    assert every_step.events == [
        ("start", 0), ("step", 1), ("step", 2), ("evaluated", 2, ["synthetic_eval"]),
        ("save", 2, False), ("step", 3), ("scalars", "train", 4), ("step", 4),
        ("evaluated", 4, ["synthetic_eval"]), ("step", 5), ("step", 6), ("save", 6, True),
        ("end", 6)]
    assert "step 6: enough" in capsys.readouterr().out
