"""tools/export_hf.py with the real client: transformers loads the export of each family
and computes praxis's logits; its tokenizer encodes as training did; what a target cannot
express is refused."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import experiments
from experiments.llama import LlamaBase
from runner.core.errors import UserError
from runner.launch import job
from tasks import datasets
from tasks.vocab import load_vocabulary
from tests.data_fixtures import REPO_ROOT
from tests.helpers import TINY
from tests.inference_fixtures import praxis_logits, save_job
from tools import export_hf

pytestmark = pytest.mark.usefixtures("compilation_cache")

# Trained on the sample corpus (so the export carries its tokenizer), sharded over 8
# devices: the export gathers the weights onto the host.
TEXT = dict(TINY, DATASET="sample", VOCAB_SIZE=1024, ICI_MESH_SHAPE=[2, 2, 2])
TEXTS = ["Return a new sorted list from the items in iterable.",
         "The  with\tstatement\nis used to wrap the execution of a block",
         "ünïcödé 日本語"]


@pytest.mark.parametrize("experiment,overrides,target", [
    (experiments.BaseExperiment, {}, "GPT2LMHeadModel"),
    (LlamaBase, dict(NUM_KV_HEADS=4), "LlamaForCausalLM"),  # 8 query heads in 4 groups
    # praxis scales queries by (MODEL_DIMS // NUM_HEADS) ** -0.5, not by the head size's;
    # repeated layers are stored stacked.
    (LlamaBase, dict(NUM_KV_HEADS=8, DIMS_PER_HEAD=16, USE_REPEATED_LAYER=True),
     "LlamaForCausalLM"),
], ids=["gpt", "llama_gqa", "llama_wide_heads_repeated"])
def test_transformers_loads_the_export_and_computes_the_same_logits(
        experiment, overrides, target, tmp_path):
    exp = experiment(**{**TEXT, **overrides})
    params, trainer = save_job(tmp_path / "run", exp)
    out = export_hf.export(str(tmp_path / "run"), str(tmp_path / "hf"))

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(model).__name__ == target
    tokenizer = AutoTokenizer.from_pretrained(out)
    vocab = load_vocabulary(datasets.sample_vocab_path())
    sequences = [tokenizer(text)["input_ids"] for text in TEXTS]
    assert sequences == [[vocab.eos_id] + vocab.encode(text) for text in TEXTS]
    assert tokenizer.decode(sequences[0], skip_special_tokens=True) == TEXTS[0]

    expected = praxis_logits(trainer, params, sequences)
    for ids, want in zip(sequences, expected, strict=True):
        with torch.no_grad():
            got = model(torch.tensor([ids])).logits[0].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_what_gpt2_cannot_express_is_refused(tmp_path):
    # Heads narrower than MODEL_DIMS / NUM_HEADS: GPT-2 derives the head size from n_embd.
    exp = experiments.BaseExperiment(**{**TINY, "NUM_HEADS": 4, "DIMS_PER_HEAD": 8})
    job.write_config(str(tmp_path), exp, exp.run_config())
    with pytest.raises(UserError, match=r"cannot export to GPT2LMHeadModel exactly: GPT-2's "
                                        r"heads span the model width"):
        export_hf.export(str(tmp_path), str(tmp_path / "hf"))


def test_export_of_a_directory_that_is_not_a_run_is_one_line_and_exit_2(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "tools.export_hf", f"--job_log_dir={tmp_path}",
         f"--output={tmp_path / 'hf'}"],
        cwd=REPO_ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
        text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == (f"error: --job_log_dir={tmp_path} has no hyperparameters.json: "
                                  f"not a training run's directory")
