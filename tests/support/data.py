"""Small data in the real formats for the data-layer tests (imported, not a conftest).

Everything here is generated: Pile-format .jsonl.zst files written with
zstandard, and a tiny SentencePiece model (~300 pieces, byte fallback) trained
once per session on a few KB of generated text.
"""

import json
import random
from pathlib import Path

import zstandard

WORDS = (
    "the a of and to in is was for on with as by at from that this it be are were "
    "model data train token river mountain city light water stone garden music paper "
    "window engine signal forest winter summer market letter number question answer "
    "system value record shadow silver golden quiet bright ancient modern simple"
).split()


def make_text(rng: random.Random, min_words: int = 5, max_words: int = 60) -> str:
    """One document: a few sentences of random words, sometimes with newlines and digits."""
    words = []
    for i in range(rng.randint(min_words, max_words)):
        w = rng.choice(WORDS)
        if i % 7 == 0:
            w = w.capitalize()
        words.append(w)
        if rng.random() < 0.08:
            words.append(str(rng.randint(0, 999)) + ".")
        if rng.random() < 0.04:
            words.append("\n")
    return " ".join(words).replace(" \n ", "\n")


def make_docs(n: int, seed: int = 0, **kw) -> list[str]:
    rng = random.Random(seed)
    return [make_text(rng, **kw) for _ in range(n)]


def pile_record(text, set_name: str = "Pile-CC") -> dict:
    return {"text": text, "meta": {"pile_set_name": set_name}}


def write_lines(path, lines, compress: bool | None = None) -> Path:
    """Write lines (str/bytes, or dicts serialised as JSON) as .jsonl or, for *.zst, .jsonl.zst."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = b""
    for line in lines:
        if isinstance(line, dict):
            line = json.dumps(line)
        if isinstance(line, str):
            line = line.encode("utf-8")
        raw += line + b"\n"
    if compress is None:
        compress = path.name.endswith(".zst")
    if compress:
        # The Pile's files carry a content checksum (zstd's CLI default); so do ours,
        # which is what lets the reader detect corruption.
        raw = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(raw)
    path.write_bytes(raw)
    return path


def write_pile(path, docs, compress: bool | None = None) -> Path:
    return write_lines(path, [pile_record(d) for d in docs], compress)


_VOCAB_CACHE: dict[str, Path] = {}


def tiny_vocab_path(tmp_path_factory) -> Path:
    """A ~320-piece BPE model with byte fallback, trained once per test session."""
    if "path" not in _VOCAB_CACHE:
        from tasks.train_vocab import train_sentencepiece

        out = tmp_path_factory.mktemp("vocab") / "tiny.model"
        train_sentencepiece(make_docs(300, seed=1234), 320, out, num_threads=1)
        _VOCAB_CACHE["path"] = out
    return _VOCAB_CACHE["path"]


def make_pile_dir(
    root, vocab_docs_seed: int = 0, num_train_files: int = 3, docs_per_file: int = 80
) -> Path:
    """A data_dir in the real layout: pile/train/NN.jsonl.zst, pile/val.jsonl.zst, lambada."""
    root = Path(root)
    for i in range(num_train_files):
        write_pile(
            root / "pile" / "train" / f"{i:02d}.jsonl.zst",
            make_docs(docs_per_file, seed=vocab_docs_seed + i),
        )
    write_pile(root / "pile" / "val.jsonl.zst", make_docs(40, seed=vocab_docs_seed + 100))
    write_pile(root / "pile" / "test.jsonl.zst", make_docs(40, seed=vocab_docs_seed + 200))
    passages = [
        t.replace("\n", " ").strip() + " river" for t in make_docs(20, seed=vocab_docs_seed + 300)
    ]
    write_lines(root / "lambada" / "lambada_test.jsonl", [{"text": p} for p in passages])
    return root


def write_tfrecord(path, examples: list[dict[str, str]]) -> Path:
    """One TFDS shard: TFRecords of tf.train.Example with byte-string features, as
    paxml's tfds_pile.py / tfds_lambada.py builds write them."""
    import tensorflow as tf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for example in examples:
            features = {name: tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[value.encode("utf-8")])) for name, value in example.items()}
            writer.write(tf.train.Example(
                features=tf.train.Features(feature=features)).SerializeToString())
    return path


def make_tfds_dir(root, train_docs: list[str], val_docs: list[str],
                  lambada_passages: list[str], num_train_shards: int = 2) -> Path:
    """A Pax user's TFDS_DATA_DIR: the_pile/lm/1.0.0 and my_lambada/lm/1.0.0 shards."""
    root = Path(root)
    pile = root / "the_pile" / "lm" / "1.0.0"
    per_shard = -(-len(train_docs) // num_train_shards)
    for i in range(num_train_shards):
        write_tfrecord(pile / f"the_pile-train.tfrecord-{i:05d}-of-{num_train_shards:05d}",
                       [{"text": d} for d in train_docs[i * per_shard:(i + 1) * per_shard]])
    write_tfrecord(pile / "the_pile-validation.tfrecord-00000-of-00001",
                   [{"text": d} for d in val_docs])
    # tfds_lambada.py stores the passage split: the context, and " " + its last word.
    examples = []
    for passage in lambada_passages:
        words = passage.split()
        examples.append({"inputs": " ".join(words[:-1]), "targets": " " + words[-1]})
    write_tfrecord(root / "my_lambada" / "lm" / "1.0.0" /
                   "my_lambada-test.tfrecord-00000-of-00001", examples)
    return root


def make_tfds_data(root, num_train: int, num_passages: int, seed: int):
    """A TFDS data directory (root/datasets: `num_train` training documents, 40 validation
    ones, `num_passages` Lambada passages ending in " harbor") and a 512-piece SentencePiece
    model trained on the documents: (data_dir, vocab_path, docs, passages)."""
    from tasks.train_vocab import train_sentencepiece

    root = Path(root)
    docs = make_docs(num_train + 40, seed=seed)
    passages = [" ".join(d.split()[:12]) + " harbor" for d in make_docs(num_passages, seed + 1)]
    make_tfds_dir(root / "datasets", docs[:num_train], docs[num_train:], passages)
    vocab = train_sentencepiece(docs, 512, root / "spm.model", num_threads=1)
    return root / "datasets", vocab, docs, passages


def write_tfds_boolq(root, splits: dict[str, list[dict]], num_shards: int = 2) -> Path:
    """TFDS's super_glue/boolq/1.0.2 under `root` (a TFDS_DATA_DIR), as
    `tfds.builder('super_glue/boolq').download_and_prepare()` writes it: each split's
    tf.train.Examples (Text "question", "passage": bytes; int32 "idx", ClassLabel "label":
    int64) in `num_shards` shards, written out of idx order as TFDS shuffles them, beside
    dataset_info.json, features.json and label.labels.txt. `splits` maps "train" and
    "validation" to {"question", "passage", "label": 0/1 or -1} records, idx = position."""
    import tensorflow as tf

    from tasks import tfds

    directory = Path(root) / "super_glue" / "boolq" / "1.0.2"
    directory.mkdir(parents=True, exist_ok=True)
    split_infos = []
    for split, records in splits.items():
        examples = []
        for idx, record in enumerate(records):
            feature = {"idx": tf.train.Feature(int64_list=tf.train.Int64List(value=[idx])),
                       "label": tf.train.Feature(int64_list=tf.train.Int64List(
                           value=[record["label"]]))}
            for name in ("passage", "question"):
                feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[record[name].encode("utf-8")]))
            examples.append(tf.train.Example(
                features=tf.train.Features(feature=feature)).SerializeToString())
        random.Random(split).shuffle(examples)
        lengths, per_shard = [], -(-len(examples) // num_shards)
        for shard in range(num_shards):
            part = examples[shard * per_shard:(shard + 1) * per_shard]
            name = f"super_glue-{split}.tfrecord-{shard:05d}-of-{num_shards:05d}"
            with tf.io.TFRecordWriter(str(directory / name)) as writer:
                for example in part:
                    writer.write(example)
            lengths.append(str(len(part)))
        split_infos.append({"name": split, "shardLengths": lengths,
                            "numBytes": str(sum(map(len, examples))),
                            "filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"})
    tfds.write_boolq_info(directory, split_infos)
    return Path(root)


# --- a user's own corpus and tokenizer (tasks/text_formats.py, tasks/tokenizer.py) ---------

CORPUS_FORMATS = (
    "jsonl", "jsonl.gz", "jsonl.zst", "parquet", "arrow", "hf_dataset", "txt", "txt_blank_line"
)


def as_blocks(docs: list[str]) -> list[str]:
    """The documents as the "blank_line" txt reader gives them back: no blank (or
    whitespace-only) lines inside, none leading or trailing."""
    return ["\n".join(line for line in d.split("\n") if line.strip()) for d in docs]


def write_corpus(tmp_path, fmt: str, docs: list[str], text_field: str = "text",
                 name: str = "corpus") -> Path:
    """Write `docs` in format `fmt` (one of CORPUS_FORMATS) under `tmp_path`; returns what a
    user would pass as the data files (tasks.text_formats.expand_files):

    jsonl, jsonl.gz, jsonl.zst, parquet: one file NAME.FMT, the text under `text_field`
      beside an integer "id" field/column.
    arrow: NAME.arrow, an Arrow IPC stream written by pyarrow (as save_to_disk writes it).
    hf_dataset: the directory NAME/ of a real `datasets.Dataset.save_to_disk` (2 shards
      when there are at least 2 documents).
    txt: the directory NAME/ with one doc-NNNN.txt per document (txt_documents="file").
    txt_blank_line: NAME.txt, the documents separated by blank lines
      (txt_documents="blank_line"); the documents must have no blank lines (as_blocks).
    """
    root = Path(tmp_path)
    root.mkdir(parents=True, exist_ok=True)
    ids = list(range(len(docs)))
    if fmt in ("jsonl", "jsonl.gz", "jsonl.zst"):
        path = root / f"{name}.{fmt}"
        raw = "".join(json.dumps({"id": i, text_field: d}) + "\n" for i, d in enumerate(docs))
        data = raw.encode("utf-8")
        if fmt == "jsonl.gz":
            import gzip

            data = gzip.compress(data)
        elif fmt == "jsonl.zst":
            data = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(data)
        path.write_bytes(data)
        return path
    if fmt in ("parquet", "arrow"):
        import pyarrow as pa

        table = pa.table({"id": pa.array(ids, pa.int64()), text_field: pa.array(docs, pa.string())})
        path = root / f"{name}.{fmt}"
        if fmt == "parquet":
            import pyarrow.parquet as pq

            # Small row groups, so a reader must cross several.
            pq.write_table(table, path, row_group_size=max(1, len(docs) // 3))
        else:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
                for batch in table.to_batches(max_chunksize=max(1, len(docs) // 3)):
                    w.write_batch(batch)
        return path
    if fmt == "hf_dataset":
        import datasets

        path = root / name
        dataset = datasets.Dataset.from_dict({"id": ids, text_field: list(docs)})
        dataset.save_to_disk(str(path), num_shards=min(2, max(1, len(docs))))
        return path
    if fmt == "txt":
        path = root / name
        path.mkdir(parents=True, exist_ok=True)
        for i, d in enumerate(docs):
            (path / f"doc-{i:04d}.txt").write_bytes(d.encode("utf-8"))
        return path
    if fmt == "txt_blank_line":
        if as_blocks(docs) != list(docs):
            raise ValueError("blank_line documents must have no blank lines; pass as_blocks(docs)")
        path = root / f"{name}.txt"
        path.write_bytes("\n\n".join(docs).encode("utf-8") + b"\n")
        return path
    raise ValueError(f"unknown corpus format {fmt!r}; one of {CORPUS_FORMATS}")


def train_hf_tokenizer(tmp_path, texts, vocab_size: int = 400,
                       special_tokens=("<pad>", "</s>")) -> Path:
    """A byte-level BPE Hugging Face tokenizer trained on `texts` with the `tokenizers`
    library; the special tokens come first (<pad> = 0, </s> = 1). Returns the path of its
    tokenizer.json (in tmp_path/hf_tokenizer/)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(special_tokens), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(list(texts), trainer)
    out = Path(tmp_path) / "hf_tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    return out / "tokenizer.json"


LLAMA3_BOS, LLAMA3_EOS = "<|begin_of_text|>", "<|end_of_text|>"


def llama3_style_tokenizer(directory, texts, vocab_size: int = 300) -> Path:
    """A tokenizer.json as Llama 3's is made (the `tokenizers` library): byte-level BPE, its
    special tokens after the vocabulary (<|begin_of_text|>, then <|end_of_text|>), and a
    post-processor that puts <|begin_of_text|> first (offsets by ByteLevel, then the
    template); beside it a tokenizer_config.json naming BOS and EOS, as the hub's has.
    Returns the tokenizer.json's path in `directory`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(list(texts), trainer)
    tokenizer.add_special_tokens([LLAMA3_BOS, LLAMA3_EOS])
    bos = tokenizer.token_to_id(LLAMA3_BOS)
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{LLAMA3_BOS} $A",
                                      pair=f"{LLAMA3_BOS} $A {LLAMA3_BOS}:1 $B:1",
                                      special_tokens=[(LLAMA3_BOS, bos)])])
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": LLAMA3_BOS, "eos_token": LLAMA3_EOS, "model_max_length": 131072,
        "clean_up_tokenization_spaces": True, "tokenizer_class": "PreTrainedTokenizerFast",
        "model_input_names": ["input_ids", "attention_mask"]}, indent=2))
    return directory / "tokenizer.json"
