"""A Hugging Face model used straight after its import: --mode=decode from starting weights
alone (a job directory without a checkpoint of its own decodes the weights
CHECKPOINT_RESTORE_PATH names, here a random Llama imported as paxloom/tools/import_hf.py says),
greedily to what transformers' generate gives; and paxloom/tools/check_hf_import.py, which compares
the two models' logits and greedy continuations, and fails when the import is wrong."""

import json
import shutil

import pytest
import torch
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from paxloom.runner.state import hf_format
from paxloom.tools import check_hf_import, import_hf
from tests.support.data import train_hf_tokenizer
from tests.support.processes import run_main, run_python

pytestmark = pytest.mark.usefixtures("compilation_cache")

TEXTS = ["the list of the day", "a list of words and more words", "day after day"] * 20
PROMPT = "the list"
STEPS = 12
EOS = 1  # train_hf_tokenizer's </s>


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    tokenizer_json = train_hf_tokenizer(root, TEXTS, vocab_size=300)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, vocab_size=320,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=1, pad_token_id=0)).eval()
    with torch.no_grad():  # far from the init, so that a wrong weight shows in the tokens
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape))
    out = root / "model"
    model.save_pretrained(out)
    shutil.copy(tokenizer_json, out / "tokenizer.json")
    return out


def transformers_greedy(hf_dir) -> str:
    """transformers' greedy continuation of PROMPT after the EOS that starts every document
    (as Paxloom decodes), as text the way Paxloom's decode writes it: decoded with the
    prompt, the prompt's text cut off, a final EOS dropped."""
    tokenizer = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    model = LlamaForCausalLM.from_pretrained(hf_dir).eval()
    prompt = [EOS] + tokenizer.encode(PROMPT).ids
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=STEPS, do_sample=False,
                             eos_token_id=EOS, pad_token_id=0)
    ids = out[0, len(prompt):].tolist()
    ids = ids[:-1] if ids and ids[-1] == EOS else ids
    return tokenizer.decode(prompt + ids)[len(tokenizer.decode(prompt)):]


@pytest.mark.process
def test_decode_reads_the_starting_weights_when_the_job_has_no_checkpoint(hf_dir, tmp_path):
    job = tmp_path / "job"
    out = run_main(*import_hf.run_flags(str(hf_dir)), "--fdl.ICI_MESH_SHAPE=[1,8,1]",
                   "--mode=decode", f"--prompt={PROMPT}", f"--max_decode_steps={STEPS}",
                   f"--job_log_dir={job}")
    assert out.returncode == 0, out.stderr[-3000:]
    said = out.stdout + out.stderr
    assert "has no checkpoint; reading the starting weights" in said
    assert str(hf_dir) in said
    (record,) = [json.loads(line) for line in (job / "decode_outputs.jsonl").open()]
    assert record["checkpoint_step"] == 0
    assert record["continuation"] == transformers_greedy(hf_dir)
    assert not (job / "checkpoints").exists() or not any((job / "checkpoints").iterdir())


def test_the_import_check_passes_and_fails_when_the_weights_differ(hf_dir, monkeypatch, capsys):
    prompts = [PROMPT, "a list of words"]
    assert check_hf_import.check(str(hf_dir), prompts, max_new_tokens=8, tolerance=1e-4)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("ok ") and "greedy: same" in line
                                   for line in lines), lines
    real = hf_format.read_params

    def perturbed(*args):  # an import that gets one weight slightly wrong
        params = real(*args)
        name = next(n for n in sorted(params) if n.endswith("/w"))
        return {**params, name: params[name] * 1.01}

    monkeypatch.setattr(hf_format, "read_params", perturbed)
    assert not check_hf_import.check(str(hf_dir), prompts, max_new_tokens=8, tolerance=1e-4)
    assert "FAIL largest logit difference" in capsys.readouterr().out


@pytest.mark.process
@pytest.mark.slow  # the in-process test above checks the comparison itself
def test_the_import_check_command_line(hf_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{PROMPT}\n")
    out = run_python("-m", "paxloom.tools.check_hf_import", f"--hf_dir={hf_dir}",
                     f"--prompts_file={prompts}", "--max_new_tokens=4")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "greedy: same" in out.stdout
    out = run_python("-m", "paxloom.tools.check_hf_import", f"--hf_dir={hf_dir}",
                     f"--prompts_file={tmp_path / 'missing.txt'}")
    assert out.returncode == 2 and out.stderr.startswith("error: --prompts_file="), out.stderr
