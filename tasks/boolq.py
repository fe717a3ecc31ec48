"""BoolQ yes/no questions, as Pax's GPU LLaMA experiments fine-tune and evaluate on them.

`--fdl.DATASET="boolq" --data_dir=DIR --vocab_path=TOKENIZER` trains on DIR/boolq/train.jsonl
and evaluates on DIR/boolq/dev.jsonl (or on train.jsonl and dev.jsonl in DIR itself): the
files of github.com/google-research-datasets/boolean-questions (gs://boolq/train.jsonl,
gs://boolq/dev.jsonl), one {"question", "title", "answer": true/false, "passage"} object per
line. SuperGLUE's copy ({"label": true/false or 0/1} instead of "answer"; val.jsonl as the
dev split) reads the same. Without them, DIR is read as Pax's TFDS_DATA_DIR (--tfds_data_dir):
TFDS's super_glue/boolq/1.0.2 train and validation shards, what Pax's seqio task 'boolq' reads
(tasks/tfds.py; without TensorFlow), each example numbered by its "idx" + 1, its line in
SuperGLUE's val.jsonl, and read in that order.

What Pax does, and so this module (paxml/contrib/gpu/scripts_gpu/tasks.py: the seqio task
'boolq' and BoolQDataset; praxis/contrib/gpu/scripts_gpu/models.py: CustomMetricsLM with
eval_task='boolq'):

- The input text is `passage + "\\nquestion: " + question + "?\\nanswer:"`; the target is
  the word "yes" or "no", as one token: the one the tokenizer continues "answer:" with
  (a byte-level BPE's " yes"), else the word tokenized on its own as Pax does; no EOS.
- A row is [BOS] + input tokens + [answer token], one example per row (never packed), and
  the loss weight is on the answer token only (weights_on_targets_only).
- Accuracy: at the answer position, the logit of the label's token must be above the logit
  of the other answer word's token (ties count as wrong); averaged over examples, batch
  padding rows excluded. Both answer words must therefore be single tokens.

Where it differs, and why:
- BOS: a row starts with the token every document of the run starts with
  (paxloom/core/framing.py: the tokenizer's EOS, Pax's framing, or its BOS under ADD_BOS);
  `BoolQ(bos_id=1)` gives LLaMA's SentencePiece BOS for a model imported from Pax or
  Hugging Face whatever ADD_BOS says.
- Truncation: Pax gives the inputs MAX_SEQ_LEN - 64 tokens (64 are its targets feature) and
  seqio keeps the first ones, which cuts off the question and "answer:" of a long passage.
  Here an input keeps its last tokens, so the question survives; the budget is the same
  (MAX_SEQ_LEN - 1 when MAX_SEQ_LEN <= 64, where Pax's would leave nothing).

A bad line in an exact evaluation set is a UserError naming file:line, never a skip.
"""

import dataclasses
import functools
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import fiddle as fdl
import jax.numpy as jnp
import numpy as np

from paxloom.core.data import DataSettings, Tokenizer
from paxloom.core.errors import UserError
from paxloom.core.framing import framing_of
from paxloom.core.spec import Evaluation
from tasks import tfds
from tasks.nodes import lambada_evaluation, required_data_dir, vocabulary
from tasks.packing import make_batch
from tasks.text_formats import jsonl_records
from tasks.vocab import PAD_ID

ANSWER_WORDS = ("yes", "no")  # Pax's TRUE_TOKEN, FALSE_TOKEN: s.encode('yes'), s.encode('no')
TARGET_RESERVE = 64  # Pax's task_feature_lengths: {'targets': 64, 'inputs': MAX_SEQ_LEN - 64}
SPLIT_FILES = {"train": ("train.jsonl",), "dev": ("dev.jsonl", "val.jsonl")}
SOURCE = ("github.com/google-research-datasets/boolean-questions (gs://boolq/{train,dev}.jsonl)"
          ", or TFDS's super_glue/boolq/1.0.2 (tfds.load('super_glue/boolq:1.0.2'))")


# ----- reading ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BoolQExample:
    question: str
    passage: str
    answer: bool
    line: int  # 1-based line in the source file (TFDS: "idx" + 1, its line in SuperGLUE's jsonl)


def format_input(example: BoolQExample) -> str:
    """The text the model reads before its answer, exactly Pax's."""
    return example.passage + "\nquestion: " + example.question + "?\nanswer:"


def _answer(record: dict, where: str) -> bool:
    """BoolQ's "answer" (true/false), or SuperGLUE's "label" (true/false or 1/0)."""
    if "answer" in record:
        value, key = record["answer"], "answer"
    elif "label" in record:
        value, key = record["label"], "label"
    else:
        raise UserError(f'{where} has no "answer" (or "label"); each line must be '
                        f'{{"question": ..., "passage": ..., "answer": true or false}}')
    if isinstance(value, bool):
        return value
    if key == "label" and value in (0, 1):
        return bool(value)
    raise UserError(f'{where} has "{key}": {json.dumps(value)}; it must be true or false'
                    + (" (or 1 or 0)" if key == "label" else ""))


def read_boolq(path) -> list[BoolQExample]:
    """Every example of a BoolQ jsonl file, in file order, or of the TFDS split whose shards
    `path` prefixes (tasks/tfds.py split_prefix), in "idx" order; UserError naming file:line
    (or shard:record) for a bad one, and for a missing or empty file."""
    path = Path(path)
    if tfds.is_tfrecord(path):
        examples = _read_tfds(path)
    elif not path.is_file():
        raise UserError(f"{path} does not exist; download BoolQ's train.jsonl and dev.jsonl "
                        f"from {SOURCE}")
    else:
        examples = list(_read_jsonl(path))
    if not examples:
        raise UserError(f"{path} has no examples; re-download it from {SOURCE}")
    return examples


def _read_jsonl(path: Path) -> Iterator[BoolQExample]:
    for where, lineno, record in jsonl_records(path, fix="fix the line or re-download the file"):
        if not isinstance(record, dict):
            raise UserError(f"{where} is not a JSON object; each line must be "
                            f'{{"question": ..., "passage": ..., "answer": true or false}}')
        for key in ("question", "passage"):
            if not isinstance(record.get(key), str):
                raise UserError(f'{where} has no "{key}" string; each line must be '
                                f'{{"question": ..., "passage": ..., "answer": true or '
                                f"false}}")
        yield BoolQExample(record["question"], record["passage"], _answer(record, where), lineno)


def _read_tfds(prefix: Path) -> list[BoolQExample]:
    """TFDS's super_glue/boolq split: tf.train.Examples with bytes "question" and
    "passage", int64 "idx" and "label" (ClassLabel ['False', 'True']; -1, the test split's,
    has no answer), sorted by idx."""
    shards = tfds.prefixed_shards(prefix)
    if not shards:
        raise UserError(f"no {prefix}-* shards; download BoolQ from {SOURCE}")
    examples = []
    for shard in shards:
        for record, raw in enumerate(tfds.read_records(shard), start=1):
            where = f"{shard}: record {record}"
            try:
                features = tfds.parse_example(raw)
            except ValueError as error:
                raise UserError(f"{where} is not a tf.train.Example ({error}); copy or build "
                                f"the dataset again") from None
            try:
                (question,), (passage,) = features["question"], features["passage"]
                (idx,), (label,) = features["idx"], features["label"]
                question, passage = question.decode("utf-8"), passage.decode("utf-8")
            except (KeyError, ValueError, TypeError, AttributeError):
                raise UserError(f"{where} is not a super_glue/boolq example (one each of bytes "
                                f"question and passage, int idx and label; it has "
                                f"{sorted(features)})") from None
            if label not in (0, 1):
                raise UserError(f"{where} has label {label}; it must be 0 (False) or 1 (True) "
                                f"(the test split has none)")
            examples.append(BoolQExample(question, passage, bool(label), int(idx) + 1))
    return sorted(examples, key=lambda example: example.line)


def boolq_file(data_dir, split: str) -> str:
    """The `split` ("train" or "dev") file under `data_dir`: DIR/boolq/NAME or DIR/NAME, else
    the prefix of the split's TFDS shards, DIR/super_glue/boolq/1.0.2/super_glue-SPLIT.tfrecord."""
    if not data_dir:
        raise UserError("DATASET='boolq' needs --data_dir (or --tfds_data_dir) naming a "
                        "directory with boolq/train.jsonl and boolq/dev.jsonl, or with TFDS's "
                        f"super_glue/boolq/1.0.2; download them from {SOURCE}")
    root = Path(data_dir)
    candidates = [folder / name for name in SPLIT_FILES[split]
                  for folder in (root / "boolq", root)]
    for path in candidates:
        if path.is_file():
            return str(path)
    prefix = tfds.split_prefix(root, tfds.BOOLQ, tfds.BOOLQ_SPLITS[split])
    if tfds.prefixed_shards(prefix):
        return str(prefix)
    raise UserError(f"no BoolQ {split} split under --data_dir={data_dir}: none of "
                    f"{', '.join(map(str, candidates))} exists, nor TFDS shards {prefix}-*; "
                    f"download it from {SOURCE}")


# ----- tokenizing ------------------------------------------------------------------------


def _tokenizer_name(tokenizer) -> str:
    return str(getattr(tokenizer, "path", None) or repr(tokenizer))


# What every input ends with (input_text): the answer word is tokenized as it follows this.
_ANSWER_CUE = "\nanswer:"


def answer_token_ids(tokenizer: Tokenizer, words: Sequence[str] = ANSWER_WORDS
                     ) -> tuple[int, int]:
    """(yes id, no id): the one token each answer word is after the input's "answer:", as
    the tokenizer continues it (" yes": a byte-level BPE's "Ġyes"; SentencePiece's "▁yes"),
    else the word encoded on its own (Pax's s.encode('yes')). One token each, since the
    accuracy compares the two tokens' logits at one position."""
    cue = list(tokenizer.encode(_ANSWER_CUE))
    ids = []
    for word in words:
        after_cue = list(tokenizer.encode(f"{_ANSWER_CUE} {word}"))
        alone = list(tokenizer.encode(word))
        if after_cue[:len(cue)] == cue and len(after_cue) == len(cue) + 1:
            ids.append(int(after_cue[-1]))
        elif len(alone) == 1:
            ids.append(int(alone[0]))
        else:
            raise UserError(
                f"tokenizer {_tokenizer_name(tokenizer)} encodes the BoolQ answer {word!r} as "
                f"{len(alone)} tokens {alone} (and after 'answer:' as "
                f"{len(after_cue) - len(cue)}), but BoolQ scores a single answer token: use a "
                f"tokenizer in which {words[0]!r} and {words[1]!r} are single tokens (LLaMA's "
                f"are), or two words that are single tokens in this one: "
                f"BoolQ(answer_words=...), --fdl.BOOLQ_ANSWER_WORDS in Pax's LLaMA experiments")
    if ids[0] == ids[1]:
        raise UserError(f"tokenizer {_tokenizer_name(tokenizer)} encodes {words[0]!r} and "
                        f"{words[1]!r} as the same token {ids[0]}; use a tokenizer that tells "
                        f"them apart")
    return ids[0], ids[1]


def input_budget(seq_len: int, max_input_tokens: int = 0) -> int:
    """How many input tokens a row holds: [BOS] + inputs + [answer] is at most seq_len + 1."""
    if max_input_tokens:
        if not 1 <= max_input_tokens <= seq_len - 1:
            raise UserError(f"BoolQ(max_input_tokens={max_input_tokens}) must be in "
                            f"[1, MAX_SEQ_LEN - 1 = {seq_len - 1}]")
        return max_input_tokens
    if seq_len > TARGET_RESERVE:
        return seq_len - TARGET_RESERVE
    return seq_len - 1


def encode_examples(examples: Sequence[BoolQExample], tokenizer: Tokenizer,
                    answer_ids: tuple[int, int], bos_id: int, budget: int,
                    num_threads: int = 1) -> list[np.ndarray]:
    """Each example's row tokens [n]: BOS, the input's last `budget` tokens, the answer."""
    inputs = tokenizer.encode_batch([format_input(e) for e in examples],
                                    num_threads=num_threads)
    yes_id, no_id = answer_ids
    return [np.asarray([bos_id, *ids[len(ids) - min(len(ids), budget):],
                        yes_id if example.answer else no_id], np.int64)
            for example, ids in zip(examples, inputs, strict=True)]


def rows_batch(tokens: Sequence[np.ndarray | None], seq_len: int, eos_id: int) -> dict:
    """The batch of one example per row (None: a padding row, all weights 0). The only
    weighted label is the last one of each row: the answer token."""
    rows = np.full((len(tokens), seq_len + 1), PAD_ID, np.int64)  # [R, L+1]
    lengths = np.zeros(len(tokens), np.int64)  # [R]
    for r, row in enumerate(tokens):
        if row is not None:
            rows[r, :len(row)] = row
            lengths[r] = len(row)
    batch = make_batch(rows, lengths, eos_id, packed=False)
    answer_pos = lengths - 2  # label p predicts token p + 1; the answer is token n - 1
    is_answer = (np.arange(seq_len)[None, :] == answer_pos[:, None]) & (lengths >= 2)[:, None]
    batch["weights"] = is_answer.astype(np.float32)  # [R, L]
    return batch


# ----- inputs ----------------------------------------------------------------------------


def _encoded(path, tokenizer, answer_ids, seq_len, bos_id, max_input_tokens,
             max_examples: int = 0):
    examples = read_boolq(path)
    if max_examples:
        examples = examples[:max_examples]
    bos = framing_of(tokenizer).start_id if bos_id < 0 else bos_id
    tokens = encode_examples(examples, tokenizer, answer_ids, bos,
                             input_budget(seq_len, max_input_tokens),
                             num_threads=min(8, os.cpu_count() or 1))
    return examples, tokens


class BoolQTrainInput:
    """The train split, one example per row, shuffled by `seed` anew each epoch and repeated
    forever. Row r of global batch b is the example at position b * global_batch_size + r of
    the stream of epochs, a pure function of (seed, position): exact resume needs only the
    batch index."""

    def __init__(self, *, path, tokenizer, answer_ids, seq_len, seed, bos_id=-1,
                 max_input_tokens=0, global_batch_size, process_rows):
        self.examples, self.tokens = _encoded(path, tokenizer, answer_ids, seq_len, bos_id,
                                              max_input_tokens)
        self.seq_len, self.seed, self.eos_id = seq_len, seed, tokenizer.eos_id
        self.global_batch_size, self.process_rows = global_batch_size, process_rows
        self.batch_index = 0
        self._orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            if len(self._orders) > 2:  # a batch spans at most a few epochs; keep memory flat
                self._orders.clear()
            rng = np.random.default_rng([self.seed, epoch])
            self._orders[epoch] = rng.permutation(len(self.tokens))
        return self._orders[epoch]

    def next_batch(self) -> dict[str, np.ndarray]:
        lo, hi = self.process_rows
        positions = self.batch_index * self.global_batch_size + np.arange(lo, hi)
        epochs, offsets = np.divmod(positions, len(self.tokens))
        rows = [self.tokens[self._order(int(e))[o]] for e, o in zip(epochs, offsets,
                                                                    strict=True)]
        self.batch_index += 1
        return rows_batch(rows, self.seq_len, self.eos_id)

    def get_state(self) -> dict:
        return {"batch_index": self.batch_index, "seed": self.seed,
                "global_batch_size": self.global_batch_size,
                "num_examples": len(self.tokens)}

    def set_state(self, state: dict) -> None:
        """Continue after the batch where get_state() was taken; UserError if the data order
        would differ."""
        mine = self.get_state()
        for key in ("seed", "global_batch_size", "num_examples"):
            if key in state and state[key] != mine[key]:
                raise UserError(
                    f"the checkpointed BoolQ input state has {key}={state[key]!r} but this run "
                    f"has {key}={mine[key]!r}, so it would not continue the same data order; "
                    f"restore with the original settings and data or start a new --job_log_dir")
        self.batch_index = int(state["batch_index"])


class BoolQEvalInput:
    """The dev split in file order (the whole split, or its first `max_examples`): row r of
    batch b is example b * global_batch_size + r; the last batch is filled with padding rows
    whose weights are all 0. `examples` keeps them for the predictions file."""

    def __init__(self, *, path, tokenizer, answer_ids, seq_len, bos_id=-1, max_input_tokens=0,
                 max_examples=0, global_batch_size, process_rows):
        self.examples, self.tokens = _encoded(path, tokenizer, answer_ids, seq_len, bos_id,
                                              max_input_tokens, max_examples)
        self.seq_len, self.eos_id = seq_len, tokenizer.eos_id
        self.global_batch_size, self.process_rows = global_batch_size, process_rows

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        lo, hi = self.process_rows
        num_batches = -(-len(self.tokens) // self.global_batch_size)
        for b in range(num_batches):
            indices = range(b * self.global_batch_size + lo, b * self.global_batch_size + hi)
            yield rows_batch([self.tokens[i] if i < len(self.tokens) else None
                              for i in indices], self.seq_len, self.eos_id)


# ----- the evaluation --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BoolQEval(Evaluation):
    """BoolQ accuracy (Pax's boolq_acc) and the loss over answer tokens.

    `answer_ids` is (yes id, no id), Pax's boolq_yn_tokens. The logits come from
    `predictions.logits`: praxis's softmax returns them in evaluation (Paxloom's chunked
    loss chunks training only), unless praxis's own `chunk_size` is set.
    """

    answer_ids: tuple[int, int]
    answer_words: tuple[str, str] = ANSWER_WORDS

    def batch_outputs(self, predictions, batch):
        logits = predictions.get("logits")  # [B, T, V]
        if logits is None:
            raise ValueError("BoolQ accuracy compares two logits, but the model's softmax "
                             "returned none in evaluation (praxis's chunk_size computes no "
                             "logits): set the softmax's chunk_size to 0")
        yes_id, no_id = self.answer_ids
        # Two vocabulary columns, not a gather per label: cheap on a vocabulary split over
        # the tensor axis.
        yes_logit = logits[..., yes_id].astype(jnp.float32)  # [B, T]
        no_logit = logits[..., no_id].astype(jnp.float32)  # [B, T]
        yes_margin = yes_logit - no_logit  # [B, T]
        # Pax: logit(label) - logit(yes + no - label) > 0 at every weighted position.
        label_margin = jnp.where(batch["labels"] == yes_id, yes_margin, -yes_margin)
        weights = batch["weights"]  # [B, T]: 1 on the answer token only
        return {
            **super().batch_outputs(predictions, batch),
            "num_answers_correct": jnp.sum((label_margin > 0) * weights, axis=1),  # [B]
            "yes_margin": jnp.sum(yes_margin * weights, axis=1),  # [B], for the file
        }

    def metrics(self, outputs):
        real = outputs["num_targets"] > 0  # rows without targets are batch padding
        if not real.any():
            raise ValueError("no BoolQ examples to score")
        targets = float(outputs["num_targets"][real].sum())
        return {
            "accuracy": float(outputs["num_answers_correct"][real].sum()) / int(real.sum()),
            "loss": -float(outputs["logprob"][real].sum()) / targets,
            "num_examples": int(real.sum()),
        }

    def write_outputs(self, directory, data, outputs):
        """boolq_predictions.jsonl: line, question, answer, predicted, correct, and the
        yes-minus-no logit margin, one line per dev example."""
        path = Path(directory) / "boolq_predictions.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        yes_word, no_word = self.answer_words
        with open(tmp, "w", encoding="utf-8") as f:
            for i, example in enumerate(data.examples):  # rows past them are batch padding
                answer = yes_word if example.answer else no_word
                correct = bool(outputs["num_answers_correct"][i] > 0)
                other = no_word if example.answer else yes_word
                f.write(json.dumps({
                    "line": example.line, "question": example.question, "answer": answer,
                    "predicted": answer if correct else other, "correct": correct,
                    "yes_margin": float(outputs["yes_margin"][i]),
                }, ensure_ascii=False) + "\n")
        os.replace(tmp, path)  # a reader never sees half a file
        return str(path)


# ----- the dataset -----------------------------------------------------------------------


def boolq_tokenizer(*, vocab_path, vocab_size: int,
                    weights_vocab: tuple[int, str] | None = None, add_bos: bool | None = None,
                    add_eos: bool = True) -> Tokenizer:
    if not vocab_path:
        raise UserError("DATASET='boolq' needs --vocab_path naming its tokenizer (a "
                        "SentencePiece .model or a tokenizer.json) with 'yes' and 'no' as "
                        "single tokens, e.g. LLaMA's tokenizer.model")
    return vocabulary(vocab_path=vocab_path, vocab_size=vocab_size, weights_vocab=weights_vocab,
                      add_bos=add_bos, add_eos=add_eos)


@dataclasses.dataclass(frozen=True)
class BoolQ:
    """BoolQ (see the module docstring): train input = the train split, evaluation
    "boolq" = the dev split, whatever EVAL_BATCHES says. Registered as DATASET="boolq"."""

    data_dir: str = ""  # holding boolq/{train,dev}.jsonl or {train,dev}.jsonl; "": --data_dir
    tokenizer_path: str = ""  # a .model or tokenizer.json; "": --vocab_path
    train: bool = True  # False: the dev split only (evaluation-only experiments)
    max_eval_examples: int = 0  # 0: the whole dev split
    max_input_tokens: int = 0  # 0: MAX_SEQ_LEN - 64 as Pax (see input_budget)
    bos_id: int = -1  # -1: the run's document start (EOS, or BOS under ADD_BOS); LLaMA's is 1
    answer_words: tuple[str, str] = ANSWER_WORDS

    def __post_init__(self):
        object.__setattr__(self, "answer_words", tuple(self.answer_words))  # hashable

    @functools.cache  # noqa: B019  (frozen, hashable instances: one set of nodes each)
    def _nodes(self, settings: DataSettings):
        """(data_dir, tokenizer, answer ids) nodes, shared so each is built once."""
        data_dir = self.data_dir or settings.data_dir
        tokenizer = fdl.Config(boolq_tokenizer,
                               vocab_path=self.tokenizer_path or settings.vocab_path,
                               vocab_size=settings.vocab_size,
                               weights_vocab=settings.weights_vocab,
                               add_bos=settings.add_bos, add_eos=settings.add_eos)
        return data_dir, tokenizer, fdl.Config(answer_token_ids, tokenizer, self.answer_words)

    def _input_args(self, settings: DataSettings, split: str) -> dict:
        data_dir, tokenizer, answer_ids = self._nodes(settings)
        return dict(path=fdl.Config(boolq_file, data_dir, split), tokenizer=tokenizer,
                    answer_ids=answer_ids, seq_len=settings.seq_len, bos_id=self.bos_id,
                    max_input_tokens=self.max_input_tokens)

    def train_input(self, settings: DataSettings):
        if not self.train:
            return None
        return fdl.Partial(BoolQTrainInput, **self._input_args(settings, "train"),
                           seed=settings.seed)

    def evaluations(self, settings: DataSettings):
        _, tokenizer, answer_ids = self._nodes(settings)
        evals = [fdl.Config(
            BoolQEval, name="boolq", answer_ids=answer_ids, answer_words=self.answer_words,
            make_input=fdl.Partial(BoolQEvalInput, **self._input_args(settings, "dev"),
                                   max_examples=self.max_eval_examples))]
        if settings.lambada_eval:  # Lambada beside it: DIR/lambada
            data_dir = fdl.Config(required_data_dir, self.data_dir or settings.data_dir)
            evals.append(lambada_evaluation(settings, data_dir, tokenizer,
                                            settings.lambada_max_examples))
        return evals

    def tokenizer(self, settings: DataSettings):
        return self._nodes(settings)[1]
