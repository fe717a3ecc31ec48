"""Check an imported Hugging Face model: transformers and Paxloom on the same prompts.

    python -m paxloom.tools.check_hf_import --hf_dir=hf/my-llama --prompts_file=prompts.txt

Reads the directory as paxloom/tools/import_hf.py does (the same run, its parameters read from the
checkpoint), tokenizes each prompt (one a line) with the directory's tokenizer.json, and
runs transformers and Paxloom on the same token ids, both in float32 (Paxloom at full matmul
precision, on this process's first device). Prints, per prompt, the largest absolute
difference between the two models' logits over the prompt's positions, and whether their
greedy continuations of --max_new_tokens tokens are the same; exits 1 when a difference is
over --tolerance (1e-4 by default: float32 sums in another order) or a continuation
differs, 2 (one line) for bad input. Needs transformers and torch (the `[hf]` extra:
`pip install '.[hf]'`; `make test` installs them).
"""

import os

import jax
import numpy as np
from absl import flags
from praxis import pax_fiddle

import experiments
from layers import architecture
from paxloom.core.data import BATCH_DTYPES
from paxloom.core.errors import UserError
from paxloom.runner.cluster import mesh as mesh_lib
from paxloom.runner.inference.model import abstract_params
from paxloom.runner.state import hf_format
from paxloom.runner.state.train_state import as_model_batch, praxis_context
from paxloom.tools import cli
from paxloom.tools.import_hf import EXPERIMENTS, TOKENIZER

FLAGS = flags.FLAGS
# --hf_dir is paxloom/tools/import_hf.py's flag (defined when it is imported): the same directory.
flags.DEFINE_string("prompts_file", None, "Prompts to check, one a line.")
flags.DEFINE_integer("max_new_tokens", 16, "Tokens of each greedy continuation compared.")
flags.DEFINE_float("tolerance", 1e-4, "The largest absolute logit difference that passes.")


class PaxloomModel:
    """The run paxloom/tools/import_hf.py makes of `hf_dir`, on one device, in float32: logits of
    one row of token ids."""

    def __init__(self, hf_dir: str):
        family, hyperparameters = hf_format.hyperparameters(hf_dir)
        exp = experiments.resolve(EXPERIMENTS[family])(
            **{**hyperparameters, "FPROP_DTYPE": "float32", "ICI_MESH_SHAPE": [1, 1, 1],
               "DCN_MESH_SHAPE": [1, 1, 1]})
        config = exp.run_config()
        self.max_seq_len = exp.MAX_SEQ_LEN
        self.model = pax_fiddle.build(config.model)
        self.mesh = mesh_lib.create_mesh([1, 1, 1], [1, 1, 1], devices=jax.devices()[:1])
        like = abstract_params(self.model, self.mesh, self.max_seq_len)
        flat = hf_format.read_params(hf_dir, architecture.architecture_of(config.model), like)
        self.params = jax.tree_util.tree_map_with_path(
            lambda path, a: jax.device_put(
                flat[jax.tree_util.keystr(path, simple=True, separator="/")], a.sharding), like)
        self._forward = jax.jit(self._logits)

    def _logits(self, params, batch):
        with praxis_context(do_eval=True):
            return self.model.apply({"params": params}, as_model_batch(batch),
                                    method=self.model.compute_predictions).logits

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """[B, T, V] logits of rows `ids` [B, T], each one document from position 0."""
        ones = np.ones(ids.shape)
        batch = {"ids": ids, "labels": ids, "weights": ones, "paddings": 0 * ones,
                 "segment_ids": ones, "segment_pos": np.broadcast_to(np.arange(ids.shape[1]),
                                                                     ids.shape)}
        batch = {k: np.asarray(v, BATCH_DTYPES[k]) for k, v in batch.items()}
        with jax.set_mesh(self.mesh), jax.default_matmul_precision("highest"):
            return np.asarray(self._forward(self.params, batch))


def greedy(logits_of, prompt: list[int], steps: int) -> list[int]:
    """`steps` greedy tokens after `prompt`, `logits_of` mapping [1, L] ids to [1, L, V]
    logits. The row keeps one length, prompt + steps (later positions never change earlier
    logits), so each model compiles once."""
    row = np.zeros((1, len(prompt) + steps), np.int64)
    row[0, :len(prompt)] = prompt
    for t in range(len(prompt), row.shape[1]):
        row[0, t] = int(np.argmax(logits_of(row)[0, t - 1]))
    return row[0, len(prompt):].tolist()


def check(hf_dir: str, prompts: list[str], max_new_tokens: int, tolerance: float) -> bool:
    """Print the comparison of each prompt; whether every one passed."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tokenizer_path = os.path.join(hf_dir, TOKENIZER)
    if not os.path.isfile(tokenizer_path):
        raise UserError(f"--hf_dir={hf_dir} has no {TOKENIZER} to tokenize the prompts with")
    tokenizer = Tokenizer.from_file(tokenizer_path)
    paxloom = PaxloomModel(hf_dir)
    reference = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()

    def transformers_logits(ids: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return reference(torch.tensor(ids)).logits.numpy()

    passed = True
    for prompt in prompts:
        ids = tokenizer.encode(prompt).ids
        if not ids or len(ids) + max_new_tokens > paxloom.max_seq_len:
            raise UserError(f"--prompts_file: {prompt!r} is {len(ids)} tokens; with "
                            f"--max_new_tokens={max_new_tokens} a prompt must be 1 to "
                            f"{paxloom.max_seq_len - max_new_tokens} tokens")
        row = np.asarray([ids])
        difference = float(np.abs(paxloom.logits(row) - transformers_logits(row)).max())
        same = (greedy(paxloom.logits, ids, max_new_tokens)
                == greedy(transformers_logits, ids, max_new_tokens))
        ok = difference <= tolerance and same
        passed &= ok
        print(f"{'ok  ' if ok else 'FAIL'} largest logit difference {difference:.3g} "
              f"(tolerance {tolerance:g}); greedy: {'same' if same else 'different'}; "
              f"{prompt!r}")
    return passed


def main(argv: list[str]) -> None:
    cli.parse_flags(argv)
    if not FLAGS.hf_dir or not FLAGS.prompts_file:
        raise UserError("--hf_dir and --prompts_file are required (python -m "
                        "paxloom.tools.check_hf_import --hf_dir=DIR --prompts_file=FILE)")
    try:
        with open(FLAGS.prompts_file, encoding="utf-8") as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
    except OSError as error:
        raise UserError(f"--prompts_file={FLAGS.prompts_file}: {error.strerror}") from None
    if not prompts:
        raise UserError(f"--prompts_file={FLAGS.prompts_file} holds no prompt")
    if not check(FLAGS.hf_dir, prompts, FLAGS.max_new_tokens, FLAGS.tolerance):
        raise SystemExit(1)


if __name__ == "__main__":
    cli.run(main)
