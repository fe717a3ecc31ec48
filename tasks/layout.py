"""Where the datasets live under a `data_dir` (the Pax `TFDS_DATA_DIR`).

    <data_dir>/pile/train/00.jsonl.zst ... 29.jsonl.zst   (any *.jsonl.zst or *.jsonl)
    <data_dir>/pile/val.jsonl.zst
    <data_dir>/pile/test.jsonl.zst
    <data_dir>/lambada/lambada_test.jsonl

or paxml's TFDS build of the same (tasks/tfds.py): the_pile/lm/1.0.0/the_pile-{train,
validation,test}.tfrecord-* and my_lambada/lm/1.0.0/my_lambada-test.tfrecord-*. The
jsonl layout wins where a directory holds both.

Each function returns the path(s) or raises UserError naming what is missing and
the command that downloads it, so a wrong `--data_dir` fails before any model is
built.
"""

from pathlib import Path

from paxloom.core.errors import UserError
from tasks import tfds

PILE_DOWNLOAD = "python scripts_gpu/download_the_pile.py --data_dir {data_dir}"
LAMBADA_DOWNLOAD = "python scripts_gpu/download_lambada.py --data_dir {data_dir}"


def pile_train_files(data_dir) -> list[Path]:
    """All train shards under <data_dir>/pile/train, sorted by name."""
    train_dir = Path(data_dir) / "pile" / "train"
    if not train_dir.is_dir():
        return _tfds_shards(
            data_dir, tfds.PILE, "train",
            f"{train_dir} does not exist (nor paxml's TFDS build, "
            f"{tfds.builder_dir(data_dir, tfds.PILE)}); download The Pile with "
            f"`{PILE_DOWNLOAD.format(data_dir=data_dir)}` or point --data_dir at it",
        )
    # Both compressed and plain jsonl are accepted so that a user can drop in an
    # already-decompressed shard or a custom corpus with a `text` field.
    files = sorted(
        p
        for p in train_dir.iterdir()
        if p.is_file() and (p.name.endswith(".jsonl.zst") or p.name.endswith(".jsonl"))
    )
    if not files:
        raise UserError(
            f"{train_dir} has no *.jsonl.zst or *.jsonl files; download The Pile with "
            f"`{PILE_DOWNLOAD.format(data_dir=data_dir)}`"
        )
    return files


def _split_files(data_dir, split: str) -> list[Path]:
    pile_dir = Path(data_dir) / "pile"
    for name in (f"{split}.jsonl.zst", f"{split}.jsonl"):
        if (pile_dir / name).is_file():
            return [pile_dir / name]
    return _tfds_shards(
        data_dir, tfds.PILE, tfds.PILE_SPLITS[split],
        f"{pile_dir / (split + '.jsonl.zst')} does not exist; download it with "
        f"`{PILE_DOWNLOAD.format(data_dir=data_dir)} --splits {split}`",
    )


def pile_val_files(data_dir) -> list[Path]:
    """The Pile validation split, <data_dir>/pile/val.jsonl.zst (or .jsonl, or TFDS shards)."""
    return _split_files(data_dir, "val")


def pile_test_files(data_dir) -> list[Path]:
    """The Pile test split, <data_dir>/pile/test.jsonl.zst (or .jsonl, or TFDS shards)."""
    return _split_files(data_dir, "test")


def lambada_files(data_dir) -> list[Path]:
    """The Lambada test set, <data_dir>/lambada/lambada_test.jsonl (or TFDS shards)."""
    path = Path(data_dir) / "lambada" / "lambada_test.jsonl"
    if not path.is_file():
        return _tfds_shards(
            data_dir, tfds.LAMBADA, "test",
            f"{path} does not exist; download it with "
            f"`{LAMBADA_DOWNLOAD.format(data_dir=data_dir)}` or point --data_dir at it",
        )
    return [path]


def _tfds_shards(data_dir, builder: tuple[str, str, str], split: str, missing: str
                 ) -> list[Path]:
    """paxml's TFDS shards of `split`, where the jsonl layout lacks the file(s); none
    either: UserError(`missing`), which names what is missing and how to download it."""
    if shards := tfds.shards(data_dir, builder, split):
        return shards
    raise UserError(missing)
