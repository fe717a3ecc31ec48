"""A VOCAB_SIZE that the starting weights fix (CHECKPOINT_RESTORE_PATH: a Hugging Face
model's config.json vocab_size, a checkpoint's embedding rows): a wrong one is refused in one
line naming that size, before the tokenizer check (which would name the tokenizer's size
rounded up), and following that line gets past every vocabulary check."""

import re
import shutil

import numpy as np
import pytest
from praxis import pax_fiddle
from transformers import LlamaConfig, LlamaForCausalLM

import experiments
from experiments.llama import LlamaBase
from layers import architecture
from paxloom.core import errors
from paxloom.core.errors import UserError
from paxloom.runner.state import hf_format
from paxloom.tools import import_hf
from tests.support.data import make_docs, train_hf_tokenizer
from tests.support.pax_checkpoints import write_pax_checkpoint
from tests.support.processes import assert_one_line, run_main
from tests.support.tiny import TINY, fdl_flags

MODEL_VOCAB = 320  # the Hugging Face model's; its tokenizer has fewer pieces, at most 300


def hf_llama(directory, tokenizer_pieces: int = 300):
    """A random Hugging Face Llama with MODEL_VOCAB ids and a tokenizer.json beside it."""
    LlamaForCausalLM(LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, vocab_size=MODEL_VOCAB,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=32)).save_pretrained(directory)
    tokenizer = train_hf_tokenizer(directory.parent / f"tok{tokenizer_pieces}",
                                   make_docs(200), vocab_size=tokenizer_pieces)
    shutil.copy(tokenizer, directory / "tokenizer.json")
    return directory


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return hf_llama(tmp_path_factory.mktemp("hf") / "llama")


def followed(message: str) -> int:
    """The VOCAB_SIZE the message's one fix sets."""
    return int(re.fullmatch(r".*; set --fdl\.VOCAB_SIZE=(\d+)", message).group(1))


# 256: below the tokenizer's pieces (the tokenizer check used to say 384, its size rounded up
# to 128, and config.json 320 after that); 384 and 512: above them, not the model's.
@pytest.mark.parametrize("vocab_size", [256, 384, 512])
def test_a_wrong_vocab_size_names_the_models_and_following_it_passes(hf_dir, vocab_size):
    _, sizes = hf_format.hyperparameters(hf_dir)
    run = {**sizes, "CHECKPOINT_RESTORE_PATH": str(hf_dir)}
    with pytest.raises(UserError) as error:  # the tokenizer is the directory's tokenizer.json
        LlamaBase(**{**run, "VOCAB_SIZE": vocab_size}).run_config()
    assert str(error.value) == (
        f"VOCAB_SIZE={vocab_size}, but the starting weights' vocabulary has {MODEL_VOCAB} ids "
        f"(config.json vocab_size of the Hugging Face model {hf_dir}); set "
        f"--fdl.VOCAB_SIZE={MODEL_VOCAB}")
    config = LlamaBase(**{**run, "VOCAB_SIZE": followed(str(error.value))}).run_config()
    assert pax_fiddle.build(config.tokenizer).vocab_size <= 300  # the tokenizer check passes
    hf_format.check_config(hf_dir, architecture.architecture_of(config.model))  # and config.json's


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_naming_it(tmp_path):
    hf_dir = hf_llama(tmp_path / "llama", tokenizer_pieces=400)
    _, sizes = hf_format.hyperparameters(hf_dir)
    config = LlamaBase(**sizes, CHECKPOINT_RESTORE_PATH=str(hf_dir)).run_config()
    with pytest.raises(UserError) as error:  # no VOCAB_SIZE fits it: no flag is suggested
        pax_fiddle.build(config.tokenizer)
    assert errors.message(error.value) == (
        f"{hf_dir}/tokenizer.json has 400 pieces, more than the starting weights' vocabulary "
        f"of {MODEL_VOCAB} ids (config.json vocab_size of the Hugging Face model {hf_dir}); "
        f"use the tokenizer they were trained with (--vocab_path)")


def test_a_pax_checkpoints_embedding_rows_fix_it_unless_ignored(tmp_path):
    """A tied GPT's one vocabulary parameter, the output layer [D, V], saved padded as paxml
    pads it for the mesh: its true rows fix VOCAB_SIZE, unless an ignore rule leaves it out."""
    params = {"lm": {"softmax": {"logits_ffn": {"linear": {
        "w": np.zeros((64, MODEL_VOCAB), np.float32)}}}}}
    write_pax_checkpoint(tmp_path, params, pad={"lm.softmax.logits_ffn.linear.w": 64})
    run = {**TINY, "CHECKPOINT_RESTORE_PATH": str(tmp_path)}  # VOCAB_SIZE=512
    with pytest.raises(UserError) as error:
        experiments.BaseExperiment(**run).run_config()
    assert str(error.value) == (
        f"VOCAB_SIZE=512, but the starting weights' vocabulary has {MODEL_VOCAB} ids (the rows "
        f"of lm/softmax/logits_ffn/linear/w in the Pax checkpoint {tmp_path}); set "
        f"--fdl.VOCAB_SIZE={MODEL_VOCAB}")
    experiments.BaseExperiment(**{**run, "VOCAB_SIZE": followed(str(error.value))}).run_config()
    experiments.BaseExperiment(**run, CHECKPOINT_IGNORE_RULES=["^lm/softmax/"]).run_config()


@pytest.mark.process
@pytest.mark.slow  # 10-15 s on 2 cores (two fresh processes): the cases above, end to end
def test_main_with_a_wrong_vocab_size_gives_one_fix_that_trains(hf_dir, tmp_path):
    flags = [*import_hf.run_flags(str(hf_dir)), *fdl_flags(
        FPROP_DTYPE="float32", DATASET="synthetic", EVAL_INTERVAL_STEPS=0, MAX_STEPS=1,
        ICI_MESH_SHAPE=[2, 2, 2], PERCORE_BATCH_SIZE=1), f"--job_log_dir={tmp_path / 'job'}"]
    out = run_main(*flags, "--fdl.VOCAB_SIZE=256")  # the later flag wins
    assert_one_line(out, f"error: VOCAB_SIZE=256, but the starting weights' vocabulary has "
                         f"{MODEL_VOCAB} ids")
    fix = out.stderr.strip().rsplit("; set ", 1)[1]
    assert fix == f"--fdl.VOCAB_SIZE={MODEL_VOCAB}"
    out = run_main(*flags, "--fdl.VOCAB_SIZE=256", fix)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "initialised" in out.stdout + out.stderr
