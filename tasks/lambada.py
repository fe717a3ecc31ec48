"""Lambada: last-word prediction, read exactly, batched for the model, and scored.

`lambada_test.jsonl` holds one `{"text": passage}` per line. The target is the
passage's last whitespace-separated word with its leading space (" word"); the
context is everything before it. Context and target are tokenized separately
and concatenated after the token every training document starts with (an EOS,
which plays BOS, or the BOS under ADD_BOS; see paxloom/core/framing.py), so the target's tokens are exactly the tokens of " word",
never merged with the context. A passage is correct when every target token is
the model's argmax. Because the eval set must be exact, a bad line is a UserError,
not a skip.

Batch rows are examples in file order: row r of global batch b is example
b * batch_size + r. The last batch is padded with rows whose weights are all 0;
`score_batch` gives them num_targets = 0 and `lambada_metrics` ignores them.
"""

import dataclasses
import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from paxloom.core.errors import UserError
from paxloom.core.framing import framing_of
from tasks import tfds
from tasks.packing import make_batch
from tasks.text_formats import jsonl_records
from tasks.vocab import PAD_ID, Vocabulary


@dataclasses.dataclass(frozen=True)
class LambadaExample:
    context: str
    target: str  # the last word with its leading whitespace, e.g. " door"
    line: int  # 1-based line in the source file


def split_target(text: str) -> tuple[str, str] | None:
    """(context, target) of a passage, or None if it has fewer than two words."""
    text = text.rstrip()
    cut = len(text)
    while cut > 0 and not text[cut - 1].isspace():
        cut -= 1
    word_start = cut
    while cut > 0 and text[cut - 1].isspace():
        cut -= 1
    if cut == 0 or word_start == len(text):
        return None
    return text[:cut], text[cut:]


def read_lambada(path) -> list[LambadaExample]:
    """All examples of a Lambada jsonl file (or a TFDS shard of paxml's my_lambada build);
    UserError naming file:line for any bad line."""
    path = Path(path)
    if tfds.is_tfrecord(path):
        return _read_tfds_lambada(path)
    if not path.is_file():
        raise UserError(
            f"{path} does not exist; download it with `python scripts_gpu/download_lambada.py`"
        )
    examples = []
    for where, lineno, record in jsonl_records(path, fix="re-download the file"):
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise UserError(
                f'{where} has no "text" string; each line must be {{"text": passage}}'
            )
        parts = split_target(text)
        if parts is None:
            raise UserError(
                f"{where} has fewer than two words, so no context and target; fix or remove it"
            )
        examples.append(LambadaExample(parts[0], parts[1], lineno))
    if not examples:
        raise UserError(f"{path} has no examples; re-download it")
    return examples


def _read_tfds_lambada(path: Path) -> list[LambadaExample]:
    """paxml's tfds_lambada.py stored each passage split already: `inputs` (the context)
    and `targets` (" " + the last word)."""
    examples = []
    for record, (context, target) in enumerate(
            tfds.iter_examples(path, ("inputs", "targets")), start=1):
        if not context.strip() or not target.strip():
            raise UserError(f"{path}: record {record} has an empty context or target; "
                            f"rebuild it with paxml's download_lambada.py")
        examples.append(LambadaExample(context, target, record))
    if not examples:
        raise UserError(f"{path} has no examples; rebuild it")
    return examples


def tokenize_example(
    example: LambadaExample, vocab: Vocabulary, seq_len: int
) -> tuple[np.ndarray, int]:
    """([n] tokens = start + context + target, number of target tokens), n <= seq_len + 1;
    start is the token that opens a training document's segment (Framing.start_id).

    A context too long for the model loses tokens from its left end, so the
    words nearest the target are kept.
    """
    context = framing_of(vocab).prompt(vocab.encode(example.context))
    target = vocab.encode(example.target)
    room = seq_len + 1 - len(target)
    if room < 1:
        raise UserError(
            f"Lambada line {example.line}: the target {example.target!r} is {len(target)} tokens, "
            f"which does not fit MAX_SEQ_LEN={seq_len}; use a longer MAX_SEQ_LEN"
        )
    return np.asarray(context[-room:] + target, np.int64), len(target)


def lambada_num_batches(num_examples: int, batch_size: int) -> int:
    return -(-num_examples // batch_size)


def lambada_batches(
    examples: Sequence[LambadaExample],
    vocab: Vocabulary,
    seq_len: int,
    batch_size: int,
    process_rows: tuple[int, int] | None = None,
) -> Iterator[dict]:
    """Eval batches (this process's rows): weights are 1.0 exactly on labels that are target tokens.

    ids = tokens[:-1], labels = tokens[1:]; paddings mark padding positions (so,
    unlike training, weights != 1 - paddings: context labels are real but unweighted).
    """
    lo, hi = process_rows if process_rows is not None else (0, batch_size)
    if not 0 <= lo < hi <= batch_size:
        raise ValueError(f"process_rows={process_rows} is not a slice of a batch of {batch_size}")
    for b in range(lambada_num_batches(len(examples), batch_size)):
        rows = np.full((hi - lo, seq_len + 1), PAD_ID, np.int64)  # [rows, L+1]
        lengths = np.zeros(hi - lo, np.int64)  # [rows]
        num_target = np.zeros(hi - lo, np.int64)  # [rows]
        for r in range(hi - lo):
            index = b * batch_size + lo + r
            if index >= len(examples):
                break  # padding row: length 0, no targets
            tokens, num_target[r] = tokenize_example(examples[index], vocab, seq_len)
            rows[r, : len(tokens)] = tokens
            lengths[r] = len(tokens)
        batch = make_batch(rows, lengths, framing_of(vocab).start_id, packed=False)
        # Label position p predicts token p+1; the targets are tokens [n-T, n), i.e. labels [n-T-1, n-1).
        pos = np.arange(seq_len)[None, :]  # [1, L]
        first = (lengths - num_target - 1)[:, None]  # [rows, 1]
        is_target = (
            (pos >= first) & (pos < (lengths - 1)[:, None]) & (num_target[:, None] > 0)
        )  # [rows, L]
        batch["weights"] = is_target.astype(np.float32)
        yield batch


def score_batch(batch: dict, predicted_ids: np.ndarray, token_logprob: np.ndarray) -> dict:
    """Per-row results from the model's outputs on a Lambada batch.

    predicted_ids: [rows, L] argmax ids; token_logprob: [rows, L] log p(label).
    Returns num_correct_targets, num_targets [rows] int64, target_logprob [rows]
    float64, and predicted_target_ids (list of per-row int lists).
    """
    weights = np.asarray(batch["weights"]) > 0  # [rows, L]
    correct = (np.asarray(predicted_ids) == batch["labels"]) & weights  # [rows, L]
    logprob = np.where(weights, np.asarray(token_logprob, np.float64), 0.0)  # [rows, L]
    return {
        "num_correct_targets": correct.sum(axis=1),
        "num_targets": weights.sum(axis=1),
        "target_logprob": logprob.sum(axis=1),
        "predicted_target_ids": [
            p[w].tolist() for p, w in zip(np.asarray(predicted_ids), weights, strict=True)
        ],
    }


def lambada_metrics(num_correct_targets, num_targets, target_logprob) -> dict:
    """Accuracy, mean target log-likelihood and target perplexity over examples.

    Arguments are per-example arrays; entries with num_targets == 0 are padding
    rows and are ignored. accuracy = fraction of examples whose target tokens are
    all argmax-correct; target_log_likelihood = mean over examples of the summed
    target log-probability; perplexity = exp(-total logprob / total target tokens).
    """
    num_correct_targets = np.asarray(num_correct_targets)
    num_targets = np.asarray(num_targets)
    target_logprob = np.asarray(target_logprob, np.float64)
    real = num_targets > 0
    if not real.any():
        raise ValueError("no Lambada examples to score")
    total_tokens = num_targets[real].sum()
    return {
        "accuracy": float(np.mean(num_correct_targets[real] == num_targets[real])),
        "target_log_likelihood": float(np.mean(target_logprob[real])),
        "perplexity": float(math.exp(-target_logprob[real].sum() / total_tokens)),
        "num_examples": int(real.sum()),
        "num_target_tokens": int(total_tokens),
    }


def write_predictions(
    path,
    examples: Sequence[LambadaExample],
    vocab: Vocabulary,
    num_correct_targets,
    num_targets,
    target_logprob,
    predicted_target_ids: Sequence[Sequence[int]],
) -> Path:
    """One JSON line per example: line, context, target, prediction (decoded), correct, target_logprob.

    The per-example arrays are in example order (padding rows already dropped).
    Written to a temporary name and renamed, so a reader never sees half a file.
    """
    path = Path(path)
    if not len(examples) == len(num_targets) == len(predicted_target_ids):
        raise ValueError("examples and per-example results have different lengths")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        for i, ex in enumerate(examples):
            record = {
                "line": ex.line,
                "context": ex.context,
                "target": ex.target,
                "prediction": vocab.decode(predicted_target_ids[i]),
                "correct": bool(num_correct_targets[i] == num_targets[i]),
                "target_logprob": float(target_logprob[i]),
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path
