"""A Hugging Face model imported, fine-tuned and exported comes back as it was imported: a
random Llama 3-style model (transformers' LlamaConfig, llama3 RoPE scaling, a 1024-position
context over an original 128) with a Llama 3-like tokenizer.json (the `tokenizers`
library: <|begin_of_text|> put first, <|end_of_text|> its EOS), fine-tuned at 128 tokens.
The export keeps config.json's context, RoPE entries and special ids (from the run
record's origin, even once the source is gone), and its tokenizer encodes as the
imported one does; where the run changed them (ADD_BOS=False) it says what the run did,
and a model trained from scratch exports its own."""

import ast
import json
import os
import shutil

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
)

from experiments.llama import LlamaBase
from paxloom.launch import job, record
from paxloom.tools import export_hf, import_hf
from tests.support import data as fx
from tests.support.inference import save_job

pytestmark = pytest.mark.usefixtures("compilation_cache")

VOCAB = 320
FINE_TUNE_LEN = 128  # the rows' length; the model's context is 1024
ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 128}
TEXTS = ["the river and the city", "Golden light.\nQuiet water, 42 stones",
         "A simple question: where is the answer?", ""]
KEPT = ("max_position_embeddings", "rope_scaling", "rope_theta", "bos_token_id",
        "eos_token_id")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A Llama 3-style model directory as the hub has one: config.json (RoPE spelt as
    rope_scaling and rope_theta, as the Llama 3.1 configs spell it), safetensors,
    tokenizer.json and tokenizer_config.json."""
    directory = tmp_path_factory.mktemp("llama3")
    fx.llama3_style_tokenizer(directory, fx.make_docs(200, seed=1))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = LlamaForCausalLM(LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, vocab_size=VOCAB,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
        max_position_embeddings=1024, rope_theta=500000.0, rope_scaling=ROPE_SCALING,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id))
    model.save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config.update(rope_theta=rope.pop("rope_theta"), rope_scaling=rope)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def imported_run(hf_dir, **overrides) -> tuple[LlamaBase, str]:
    """(the experiment, --vocab_path) that paxloom/tools/import_hf.py's flags make of
    `hf_dir`, with `overrides` after them (the later flag wins)."""
    values, vocab_path = {}, None
    for flag in import_hf.run_flags(str(hf_dir)):
        name, _, value = flag.partition("=")
        if name.startswith("--fdl."):  # a Python literal, else a string (main.py reads both)
            try:
                values[name[len("--fdl."):]] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                values[name[len("--fdl."):]] = value
        elif name == "--vocab_path":
            vocab_path = value
        else:
            assert flag == "--fdl_config=experiments.llama.LlamaBase", flag
    return LlamaBase(**{**values, **overrides}), vocab_path


def assert_same_tokenizer(before_dir, after_dir):
    before = AutoTokenizer.from_pretrained(before_dir)
    after = AutoTokenizer.from_pretrained(after_dir)
    for text in TEXTS:
        assert after(text)["input_ids"] == before(text)["input_ids"], text
        assert after(text, TEXTS[0])["input_ids"] == before(text, TEXTS[0])["input_ids"]
        ids = before(text)["input_ids"]
        assert after.decode(ids, skip_special_tokens=True) == before.decode(
            ids, skip_special_tokens=True)
    assert (after.bos_token, after.eos_token, after.pad_token) == (
        before.bos_token, before.eos_token, before.pad_token)
    assert after(TEXTS[0])["input_ids"][0] == before.bos_token_id  # BOS first, as imported


def exported_config(directory) -> dict:
    return json.loads((directory / "config.json").read_text())


def test_import_fine_tune_export_gives_back_the_imported_model(hf_dir, tmp_path):
    source = tmp_path / "hf"  # a copy: it is taken apart below
    shutil.copytree(hf_dir, source)
    corpus = fx.write_corpus(tmp_path / "data", "jsonl", fx.make_docs(300, seed=5))
    exp, vocab_path = imported_run(
        source, MAX_SEQ_LEN=FINE_TUNE_LEN, DATASET="text", FPROP_DTYPE="float32",
        ICI_MESH_SHAPE=[2, 2, 2], PERCORE_BATCH_SIZE=1, MAX_STEPS=2, SUMMARY_INTERVAL_STEPS=1,
        EVAL_INTERVAL_STEPS=0, LEARNING_RATE=1e-2)
    assert exp.ADD_BOS is None  # the default: as the tokenizer's post-processor does
    config = exp.run_config(data_dir=str(corpus), vocab_path=vocab_path)
    job.run(exp, job.RunOptions(job_log_dir=str(tmp_path / "run"), data_locations={
        "data_dir": str(corpus), "vocab_path": vocab_path}), config=config)
    run = record.read_record(str(tmp_path / "run" / "hyperparameters.json"))
    assert run["origin"]["hf_dir"] == str(source)

    out = export_hf.export(str(tmp_path / "run"), str(tmp_path / "export"))
    imported, exported = exported_config(hf_dir), exported_config(out)
    assert {key: exported.get(key) for key in KEPT} == {key: imported[key] for key in KEPT}
    assert "rope_parameters" not in exported  # spelt as the checkpoint spelt it
    assert exported["max_position_embeddings"] == 1024 != FINE_TUNE_LEN
    before, after = AutoConfig.from_pretrained(hf_dir), AutoConfig.from_pretrained(out)
    for key in ("max_position_embeddings", "rope_parameters", "bos_token_id", "eos_token_id",
                "pad_token_id"):
        assert getattr(after, key) == getattr(before, key), key
    assert_same_tokenizer(hf_dir, out)
    tokenizer_json = [json.loads((d / "tokenizer.json").read_text()) for d in (hf_dir, out)]
    assert tokenizer_json[1]["post_processor"] == tokenizer_json[0]["post_processor"]

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tuned = dict(model.named_parameters())["model.layers.0.mlp.up_proj.weight"]
    original = dict(AutoModelForCausalLM.from_pretrained(hf_dir).named_parameters())[
        "model.layers.0.mlp.up_proj.weight"]
    assert not torch.equal(tuned, original)  # it was fine-tuned
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()

    # The record carries the imported entries: the export is the same with the model gone.
    for name in ("config.json", "model.safetensors"):
        os.remove(source / name)
    again = export_hf.export(str(tmp_path / "run"), str(tmp_path / "export-again"))
    assert exported_config(again) == exported


def test_what_the_run_changed_is_exported_as_the_run_did_it(hf_dir, tmp_path):
    """ADD_BOS=False trains without the BOS: the export's tokenizer puts the EOS first, as
    training did, and names it BOS; the context and RoPE are still the imported model's."""
    exp, _ = imported_run(hf_dir, MAX_SEQ_LEN=FINE_TUNE_LEN, DATASET="synthetic",
                          ADD_BOS=False, ICI_MESH_SHAPE=[2, 2, 2])
    save_job(tmp_path / "run", exp)  # a record without an origin: read from the source
    out = export_hf.export(str(tmp_path / "run"), str(tmp_path / "export"))
    imported, exported = exported_config(hf_dir), exported_config(out)
    eos = imported["eos_token_id"]
    assert (exported["bos_token_id"], exported["eos_token_id"]) == (eos, eos)
    for key in ("max_position_embeddings", "rope_scaling", "rope_theta"):
        assert exported[key] == imported[key], key
    before, after = AutoTokenizer.from_pretrained(hf_dir), AutoTokenizer.from_pretrained(out)
    assert after.bos_token == after.eos_token == before.eos_token
    for text in TEXTS:
        assert after(text)["input_ids"] == [eos] + before(text)["input_ids"][1:]


def test_a_model_trained_from_scratch_exports_its_own_context_and_rope(hf_dir, tmp_path):
    exp, _ = imported_run(hf_dir, MAX_SEQ_LEN=FINE_TUNE_LEN, DATASET="synthetic",
                          CHECKPOINT_RESTORE_PATH=None, ICI_MESH_SHAPE=[2, 2, 2])
    save_job(tmp_path / "run", exp)
    exported = exported_config(export_hf.export(
        str(tmp_path / "run"), str(tmp_path / "export"), vocab_path=str(hf_dir)))
    assert exported["max_position_embeddings"] == FINE_TUNE_LEN
    assert exported["rope_parameters"] == {**ROPE_SCALING, "rope_theta": 500000.0}
    assert "rope_scaling" not in exported and exported["pad_token_id"] == 0
