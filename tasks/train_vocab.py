"""Train a SentencePiece vocabulary from Pile-format train files.

    python -m tasks.train_vocab --data_dir=DIR --vocab_size=32000 --output=DIR/spm32k.model

The model is BPE with byte fallback (no text is ever <unk>), and ids
pad=0, eos=1, unk=2, no BOS: pad=0 matches the data layer's padding id, and the
EOS piece both ends documents and starts the next one (see tasks/packing.py), so
a separate BOS is not needed. Training text is the lines of the first documents
of the train files in order (The Pile's shards are already shuffled, so they are
a fair sample), up to --max_sentences lines.
"""

import io
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import sentencepiece as spm
from absl import flags, logging

from paxloom.core.errors import UserError
from tasks import layout
from tasks.progress import Heartbeat, Progress
from tasks.text_formats import iter_documents

# SentencePiece drops longer sentences; cut them instead so long lines still count.
MAX_SENTENCE_BYTES = 4096
TRAINER_OPTIONS = dict(
    model_type="bpe",
    byte_fallback=True,
    pad_id=0,
    eos_id=1,
    unk_id=2,
    bos_id=-1,
    character_coverage=0.9995,
    max_sentence_length=MAX_SENTENCE_BYTES,
    # Small corpora cannot always fill the requested size; a slightly smaller
    # model beats failing (check_vocab_size accepts any VOCAB_SIZE >= the real size).
    hard_vocab_limit=False,
    minloglevel=2,
)


def sentences(texts: Iterable[str], max_sentences: int,
              progress: Progress | None = None) -> Iterator[str]:
    """Non-empty lines of the texts, cut to MAX_SENTENCE_BYTES, at most max_sentences."""
    count = 0
    for text in texts:
        for line in text.split("\n"):
            line = line.strip()
            if not line:
                continue
            yield line.encode("utf-8")[:MAX_SENTENCE_BYTES].decode("utf-8", "ignore")
            count += 1
            if progress is not None:
                progress.update(count)
            if count >= max_sentences:
                return


def train_sentencepiece(
    texts: Iterable[str],
    vocab_size: int,
    output,
    max_sentences: int = 2_000_000,
    num_threads: int | None = None,
) -> Path:
    """Train a model on `texts` and write it atomically to `output` (a .model file)."""
    output = Path(output)
    if vocab_size < 256 + 3 + 1:
        raise UserError(
            f"--vocab_size={vocab_size} is too small: byte fallback needs 259 ids; use >= 260"
        )
    model = io.BytesIO()
    # SentencePiece first reads every sentence (progress against max_sentences, an upper
    # bound), then trains without reporting anything (a heartbeat says it is alive).
    reading = Progress(f"vocabulary for {output.name}: reading sentences", max_sentences,
                       unit="sentences")
    training = Heartbeat(f"vocabulary for {output.name}: training {vocab_size} BPE pieces")

    def sentences_then_training():
        yield from sentences(texts, max_sentences, reading)
        reading.finish()
        training.start()

    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences_then_training(),
            model_writer=model,
            vocab_size=vocab_size,
            num_threads=num_threads or os.cpu_count() or 1,
            **TRAINER_OPTIONS,
        )
    except RuntimeError as e:
        # e.g. "Vocabulary size is smaller than required_chars. 300 vs 312."
        reason = str(e).strip().splitlines()[-1].split("] ")[-1]
        raise UserError(f"SentencePiece training for {output} failed: {reason}") from None
    finally:
        training.stop()
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + f".tmp{os.getpid()}")
    tmp.write_bytes(model.getvalue())
    os.replace(tmp, output)
    return output


def _texts(files) -> Iterator[str]:
    for path in files:
        yield from iter_documents(path)


def main(argv):
    del argv
    files = layout.pile_train_files(FLAGS.data_dir)
    out = train_sentencepiece(_texts(files), FLAGS.vocab_size, FLAGS.output, FLAGS.max_sentences)
    logging.info("wrote %s", out)
    print(f"wrote {out}")


if __name__ == "__main__":
    flags.DEFINE_string(
        "data_dir", None, "Directory holding pile/train/*.jsonl.zst.", required=True
    )
    flags.DEFINE_integer("vocab_size", 32000, "Number of pieces (byte fallback needs >= 260).")
    flags.DEFINE_string("output", None, "Where to write the .model file.", required=True)
    flags.DEFINE_integer(
        "max_sentences", 2_000_000, "Cap on training lines read from the train files."
    )
    FLAGS = flags.FLAGS
    from tasks import cli

    cli.run(main)
