"""Your own corpus (tasks/text.py's TextFiles): every reader with each kind of tokenizer
trains through the real input pipeline, and a run resumed from its input position and
state continues with exactly the losses of an uninterrupted run."""

import dataclasses

import jax
import numpy as np
import pytest
from praxis import pax_fiddle

import experiments
from paxloom.core.callbacks import Callback
from paxloom.core.errors import UserError
from paxloom.runner.cluster import mesh as mesh_lib
from paxloom.runner.training.trainer import Trainer
from tasks import datasets
from tasks.text import TextFiles, held_out
from tests.support.data import (
    as_blocks,
    make_docs,
    tiny_vocab_path,
    train_hf_tokenizer,
    write_corpus,
)
from tests.support.tiny import TINY

pytestmark = pytest.mark.usefixtures("compilation_cache")

READERS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet", "txt", "hf_dataset")
DOCS = make_docs(120, seed=7)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    return {"sentencepiece": tiny_vocab_path(tmp_path_factory),
            "tokenizer.json": train_hf_tokenizer(tmp_path_factory.mktemp("hf"), DOCS)}


class Losses(Callback):
    """Each step's loss, and the state and input position after the first step (on the host,
    before the next step donates the state)."""

    def on_start(self, run):
        self.losses = []

    def after_step(self, info):
        self.losses.append(float(info.metrics["loss"]))
        if info.step == 1:
            self.after_first = jax.device_get(info.state), info.input_state


def trainer_of(dataset, tmp_path, max_steps):
    class Own(experiments.BaseExperiment):
        def dataset(self):
            return dataset

    exp = Own(**{**TINY, "ICI_MESH_SHAPE": [2, 2, 2], "MAX_STEPS": max_steps,
                 "SUMMARY_INTERVAL_STEPS": 100, "EVAL_BATCHES": 1})
    run = pax_fiddle.build(exp.run_config(cache_dir=str(tmp_path / "cache")))
    mesh = mesh_lib.create_mesh(run.mesh.ici_mesh_shape, run.mesh.dcn_mesh_shape)
    return Trainer(run, mesh, str(tmp_path)), run


@pytest.mark.parametrize("tokenizer", ["sentencepiece", "tokenizer.json"])
@pytest.mark.parametrize("reader", READERS)
def test_each_reader_trains_with_each_tokenizer(tmp_path, tokenizers, reader, tokenizer):
    """Every reader x tokenizer trains, evaluates its held-out documents, and resumes from
    its state and input position after step 1 with exactly the uninterrupted run's loss."""
    docs = as_blocks(DOCS) if reader.startswith("txt") else DOCS
    files = write_corpus(tmp_path / "data", reader, docs, text_field="body")
    dataset = TextFiles(train=str(files), text_field="body", validation_fraction=0.1,
                        tokenizer_path=str(tokenizers[tokenizer]))
    trainer, run = trainer_of(dataset, tmp_path, max_steps=3)
    assert run.tokenizer.path == tokenizers[tokenizer]
    uninterrupted = Losses()
    final = trainer.train(callbacks=[uninterrupted])
    assert all(np.isfinite(uninterrupted.losses)) and len(uninterrupted.losses) == 3
    (validation,) = run.evals
    assert validation.name == "validation"
    assert np.isfinite(trainer.evaluate(final["params"], 3)["validation"]["loss"])

    state, position = uninterrupted.after_first
    resumed = Losses()
    trainer.train(jax.device_put(state, trainer.state_shardings), position, [resumed])
    assert resumed.losses == uninterrupted.losses[1:]


def test_held_out_documents_are_a_stable_fraction():
    chosen = [held_out("corpus.jsonl", i, 0.1) for i in range(20_000)]
    assert 0.09 < np.mean(chosen) < 0.11
    assert chosen == [held_out("corpus.jsonl", i, 0.1) for i in range(20_000)]
    assert not any(held_out("corpus.jsonl", i, 0.0) for i in range(1000))


def test_dataset_names_resolve_through_the_registry_with_a_near_match():
    assert {"synthetic", "sample", "pile", "none", "text"} <= set(datasets.registered())
    assert datasets.lookup("text") == TextFiles()
    with pytest.raises(UserError, match=r"DATASET='sampel' is not a registered dataset .*"
                                        r"\(did you mean sample\?\)"):
        experiments.BaseExperiment(DATASET="sampel")


def test_text_files_take_the_command_lines_data_dir_and_tokenizer(tmp_path, tokenizers):
    write_corpus(tmp_path / "corpus", "jsonl", DOCS)
    exp = experiments.BaseExperiment(**{**TINY, "DATASET": "text"})
    run = pax_fiddle.build(exp.run_config(data_dir=str(tmp_path / "corpus"),
                                          vocab_path=str(tokenizers["tokenizer.json"]),
                                          cache_dir=str(tmp_path / "cache")))
    data = run.make_train_input(global_batch_size=8, process_rows=(0, 8))
    assert data.next_batch()["ids"].shape == (8, TINY["MAX_SEQ_LEN"])
    assert run.tokenizer.path == tokenizers["tokenizer.json"]


@pytest.mark.parametrize("dataset, hint", [
    ("text", "point --data_dir at your data files"),
    ("pile", "point --data_dir at a directory with pile/ and lambada/"),
])
def test_a_data_dir_that_does_not_exist_names_the_flag(tmp_path, tokenizers, dataset, hint):
    exp = experiments.BaseExperiment(**{**TINY, "DATASET": dataset})
    config = exp.run_config(data_dir=str(tmp_path / "wrong"),
                            vocab_path=str(tokenizers["sentencepiece"]))
    with pytest.raises(UserError, match=rf"^--data_dir=\S+/wrong: no such directory; {hint}"):
        pax_fiddle.build(config)
    with pytest.raises(UserError, match=rf"^DATASET='{dataset}' needs --data_dir"):
        pax_fiddle.build(exp.run_config(vocab_path=str(tokenizers["sentencepiece"])))


@pytest.mark.parametrize("how", ["fraction", "files"])
def test_a_validation_split_of_text_from_the_command_line(tmp_path, tokenizers, how):
    """DATASET="text" validates, without code, on a held-out share of the training documents
    (VALIDATION_FRACTION) or on files of its own (VALIDATION_FILES): disjoint from training."""
    write_corpus(tmp_path / "corpus", "jsonl", DOCS)
    write_corpus(tmp_path / "held_out", "jsonl", make_docs(40, seed=8))
    split = ({"VALIDATION_FRACTION": 0.2} if how == "fraction" else
             {"VALIDATION_FILES": str(tmp_path / "held_out")})
    exp = experiments.BaseExperiment(**{**TINY, "DATASET": "text", "EVAL_BATCHES": 1, **split})
    run = pax_fiddle.build(exp.run_config(data_dir=str(tmp_path / "corpus"),
                                          vocab_path=str(tokenizers["tokenizer.json"]),
                                          cache_dir=str(tmp_path / "cache")))
    (validation,) = run.evals
    assert validation.name == "validation"
    held = [b["ids"] for b in validation.make_input(global_batch_size=8, process_rows=(0, 8))]
    trained = run.make_train_input(global_batch_size=8, process_rows=(0, 8)).next_batch()["ids"]
    assert held and not {tuple(r) for r in trained} & {tuple(r) for b in held for r in b}
    plain = experiments.BaseExperiment(**{**TINY, "DATASET": "text", "EVAL_BATCHES": 1})
    assert pax_fiddle.build(plain.run_config(data_dir=str(tmp_path / "corpus"),
                                             vocab_path=str(tokenizers["tokenizer.json"]),
                                             cache_dir=str(tmp_path / "cache"))).evals == []
    with pytest.raises(UserError, match="VALIDATION_FILES / VALIDATION_FRACTION: "
                                        "DATASET='synthetic' has its own validation set"):
        experiments.BaseExperiment(**{**TINY, **split})


def test_bad_text_files_settings_are_one_line():
    with pytest.raises(UserError, match=r"validation_fraction=1.5\) must be in \[0, 1\)"):
        TextFiles(validation_fraction=1.5)
    with pytest.raises(UserError, match="not both"):
        TextFiles(validation="v.jsonl", validation_fraction=0.1)
    assert dataclasses.replace(TextFiles(train=["a", "b"])).train == ("a", "b")


def test_token_id_data_take_the_command_lines_tokenizer(tokenizers):
    """Synthetic data have no tokenizer, unless --vocab_path names one: then the run graph
    holds it, and decode and export read and write text with it."""
    exp = experiments.BaseExperiment(**TINY)
    assert exp.run_config().tokenizer is None
    run = pax_fiddle.build(exp.run_config(vocab_path=str(tokenizers["tokenizer.json"])))
    assert run.tokenizer.path == tokenizers["tokenizer.json"]
