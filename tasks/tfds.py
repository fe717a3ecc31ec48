"""A Pax user's TFDS data directory, read as it is.

paxml's download_the_pile.py and download_lambada.py (tfds_pile.py, tfds_lambada.py)
build TFDS datasets: TFRecord shards of serialized `tf.train.Example`s with the
features as byte strings:

    <tfds_data_dir>/the_pile/lm/1.0.0/the_pile-train.tfrecord-00000-of-NNNNN     text
                                      the_pile-validation.tfrecord-...          text
                                      the_pile-test.tfrecord-...                text
    <tfds_data_dir>/my_lambada/lm/1.0.0/my_lambada-test.tfrecord-00000-of-00001  inputs, targets

They are read with TensorFlow's own TFRecord reader (TensorFlow is imported on this
path only: `pip install .[tfds]`) and tokenized into the same prepared shards as the
jsonl files, so training never touches TensorFlow after the first pass.
"""

import os
from collections.abc import Iterator
from pathlib import Path

from google.protobuf.message import DecodeError

from core.errors import UserError

PILE = ("the_pile", "lm", "1.0.0")
LAMBADA = ("my_lambada", "lm", "1.0.0")
PILE_SPLITS = {"train": "train", "val": "validation", "test": "test"}


def builder_dir(data_dir, builder: tuple[str, str, str]) -> Path:
    return Path(data_dir).joinpath(*builder)


def is_tfrecord(path) -> bool:
    return ".tfrecord" in Path(path).name


def shards(data_dir, builder: tuple[str, str, str], split: str) -> list[Path]:
    """The split's TFRecord shards, in order; [] when the builder has none."""
    directory = builder_dir(data_dir, builder)
    if not directory.is_dir():
        return []
    prefix = f"{builder[0]}-{split}.tfrecord"
    return sorted(p for p in directory.iterdir() if p.name.startswith(prefix) and p.is_file())


def _tensorflow():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # no C++ start-up banners
    try:
        import tensorflow as tf
    except ImportError:
        raise UserError("reading TFDS TFRecord data needs TensorFlow: pip install '.[tfds]' "
                        "(or convert the data to jsonl.zst with scripts_gpu/download_the_pile.py)"
                        ) from None
    tf.config.set_visible_devices([], "GPU")  # TensorFlow must never take a GPU from JAX
    return tf


def iter_examples(path, features: tuple[str, ...], stats=None) -> Iterator[tuple[str, ...]]:
    """The named byte-string features of each tf.train.Example in one TFRecord shard, as
    text. `stats` (tasks.text_formats.ReadStats), if given, counts records and bytes read."""
    tf = _tensorflow()
    dataset = tf.data.TFRecordDataset(str(path))
    record = 0
    try:
        for raw in dataset.as_numpy_iterator():
            record += 1
            if stats is not None:
                stats.lines = record
                stats.bytes_read += len(raw) + 16  # length, two CRCs
            try:
                example = tf.train.Example.FromString(raw)
            except DecodeError:
                raise UserError(f"{path}: record {record} is not a tf.train.Example; expected "
                                f"paxml's TFDS build") from None
            values = []
            for name in features:
                feature = example.features.feature.get(name)
                if feature is None or not feature.bytes_list.value:
                    raise UserError(f"{path}: record {record} has no bytes feature {name!r}; "
                                    f"expected paxml's TFDS build with features {features}")
                values.append(feature.bytes_list.value[0].decode("utf-8"))
            yield tuple(values)
    except tf.errors.OpError as error:  # DataLossError: a truncated or corrupt shard
        raise UserError(f"{path} is corrupt after {record} records ({error.message}); "
                        f"rebuild it with paxml's download script") from None
