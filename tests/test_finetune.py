"""The fine-tuning workflow of Pax's LLaMA experiments, end to end on a tiny model: import a
Hugging Face Llama (built random with transformers, grouped-query), evaluate it zero-shot on
BoolQ, fine-tune it with LoRA, and check what changed.
"""

import re
import shutil

import jax
import numpy as np
import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from experiments.llama import LlamaBase
from layers import architecture
from paxloom.launch import job
from paxloom.runner.state import checkpoints, hf_format
from tests.support.files import tree_digest
from tests.test_boolq import write_boolq, yes_no_tokenizer

pytestmark = pytest.mark.usefixtures("compilation_cache")

VOCAB = 400


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A Hugging Face Llama directory as a user downloads one: config.json, safetensors and
    the model's tokenizer.json (in which 'yes' and 'no' are single tokens)."""
    directory = tmp_path_factory.mktemp("hf_llama")
    model = LlamaForCausalLM(LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, vocab_size=VOCAB,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=64, rms_norm_eps=1e-5))
    model.save_pretrained(directory)
    shutil.copy(yes_no_tokenizer(tmp_path_factory, VOCAB), directory / "tokenizer.json")
    return directory


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_boolq(tmp_path_factory.mktemp("data"))


def experiment(hf_dir, **overrides):
    """A LoRA BoolQ fine-tune of the model in `hf_dir`, as paxloom/tools/import_hf.py's flags say."""
    family, sizes = hf_format.hyperparameters(str(hf_dir))
    assert family == "llama"
    return LlamaBase(**{
        **sizes, "CHECKPOINT_RESTORE_PATH": str(hf_dir), "DATASET": "boolq",
        "USE_LORA": True, "LORA_RANK": 4, "PACKED_INPUT": False, "FPROP_DTYPE": "float32",
        "ICI_MESH_SHAPE": [2, 2, 2], "PERCORE_BATCH_SIZE": 1, "MAX_STEPS": 3,
        "EVAL_INTERVAL_STEPS": 3, "SUMMARY_INTERVAL_STEPS": 1, "LEARNING_RATE": 1e-2,
        **overrides})


def run(exp, data_dir, job_dir, mode):
    # No --vocab_path: the run encodes with the imported model's own tokenizer.json.
    config = exp.run_config(data_dir=str(data_dir))
    return job.run(exp, job.RunOptions(mode=mode, job_log_dir=str(job_dir)), config=config)


def test_lora_fine_tune_of_an_imported_llama_on_boolq(hf_dir, data_dir, tmp_path, capsys):
    source = tree_digest(hf_dir)
    # Zero-shot: the imported weights themselves, with adapters (at zero) and without.
    base = run(experiment(hf_dir, USE_LORA=False), data_dir, tmp_path / "base", "eval")
    adapted = run(experiment(hf_dir), data_dir, tmp_path / "zero-shot", "eval")
    assert adapted["boolq"]["loss"] == base["boolq"]["loss"]
    assert adapted["boolq"]["accuracy"] == base["boolq"]["accuracy"]

    exp = experiment(hf_dir)
    run(exp, data_dir, tmp_path / "lora", "train")
    out = capsys.readouterr().out
    assert re.search(r"initialised (\d+) of (\d+) parameters from Hugging Face model .*; "
                     r"(\d+) keep their initialisation", out), out
    accuracy = re.search(r"step +3 \| eval boolq \| accuracy ([\d.]+)", out)
    assert accuracy and 0.0 <= float(accuracy.group(1)) <= 1.0, out

    # Leaf by leaf: the imported weights are untouched, every adapter's B has moved.
    step, state = checkpoints.load_numpy(checkpoints.job_checkpoint_dir(str(tmp_path / "lora")))
    assert step == 3
    params = {checkpoints.param_path(p): leaf
              for p, leaf in jax.tree_util.tree_flatten_with_path(state["params"])[0]}
    imported = hf_format.read_params(str(hf_dir), architecture.architecture_of(
        exp.run_config(data_dir=str(data_dir)).model), state["params"])
    adapters = [name for name in params if "lora" in name]
    assert sorted(imported) == sorted(set(params) - set(adapters))
    for name, value in imported.items():
        assert params[name].tobytes() == value.tobytes(), name
    for name in adapters:
        if name.endswith("lora_b"):
            assert np.abs(params[name]).max() > 0, name

    # Adam's moments exist for the adapters only.
    moments = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(state["opt_state"]))
    full = 2 * sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(state["params"]))
    print(f"optimizer state: {moments:,} bytes with LoRA rank 4, {full:,} for full fine-tuning")
    assert moments < 0.2 * full
    assert tree_digest(hf_dir) == source  # the imported directory was only read
