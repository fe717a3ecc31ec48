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

BoolQ as Pax's seqio task 'boolq' reads it (tfds_name='super_glue/boolq', pinned 1.0.2),
as TFDS itself writes it (ClassLabel "label", int32 "idx", Text "passage" and "question"):

    <tfds_data_dir>/super_glue/boolq/1.0.2/super_glue-train.tfrecord-00000-of-NNNNN
                                           super_glue-validation.tfrecord-...

is read without TensorFlow (read_records, parse_example: the TFRecord framing with its
CRC32C checks and the tf.train.Example wire format, in Python), since it is read again by
every run, on GPU machines that have no TensorFlow.
"""

import itertools
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from google.protobuf.message import DecodeError

from paxloom.core.errors import UserError

PILE = ("the_pile", "lm", "1.0.0")
LAMBADA = ("my_lambada", "lm", "1.0.0")
PILE_SPLITS = {"train": "train", "val": "validation", "test": "test"}
BOOLQ = ("super_glue", "boolq", "1.0.2")  # Pax's seqio task 'boolq' (pinned_version)
BOOLQ_SPLITS = {"train": "train", "dev": "validation"}


def builder_dir(data_dir, builder: tuple[str, str, str]) -> Path:
    return Path(data_dir).joinpath(*builder)


def write_boolq_info(directory: Path, split_infos: list[dict]) -> None:
    """The metadata TFDS writes beside BoolQ's shards (dataset_info.json, features.json,
    label.labels.txt), with `split_infos` (each split's name, numBytes, shardLengths and
    filepathTemplate) as dataset_info.json's splits."""
    name, config, version = BOOLQ
    (directory / "dataset_info.json").write_text(json.dumps({
        "name": name, "configName": config, "version": version, "fileFormat": "tfrecord",
        "moduleName": "tensorflow_datasets.text.super_glue", "splits": split_infos}, indent=2))
    text = {"pythonClassName": "tensorflow_datasets.core.features.text_feature.Text", "text": {}}
    (directory / "features.json").write_text(json.dumps({
        "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
        "featuresDict": {"features": {
            "idx": {"pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor",
                    "tensor": {"shape": {}, "dtype": "int32", "encoding": "none"}},
            "label": {"pythonClassName":
                      "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
                      "classLabel": {"numClasses": "2"}},
            "passage": text, "question": text}}}, indent=2))
    (directory / "label.labels.txt").write_text("False\nTrue\n")


def is_tfrecord(path) -> bool:
    return ".tfrecord" in Path(path).name


def split_prefix(data_dir, builder: tuple[str, str, str], split: str) -> Path:
    """What a split's shard names start with: <builder dir>/<name>-<split>.tfrecord."""
    return builder_dir(data_dir, builder) / f"{builder[0]}-{split}.tfrecord"


def shards(data_dir, builder: tuple[str, str, str], split: str) -> list[Path]:
    """The split's TFRecord shards, in order; [] when the builder has none."""
    return prefixed_shards(split_prefix(data_dir, builder, split))


def prefixed_shards(prefix) -> list[Path]:
    """The shards named `prefix`-XXXXX-of-NNNNN (split_prefix), in order."""
    directory, name = Path(prefix).parent, Path(prefix).name
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.startswith(name) and p.is_file())


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


# ----- TFRecords without TensorFlow ------------------------------------------------------


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC32C of `data`, rotated right by 15 bits plus a constant."""
    crc, table = 0xFFFFFFFF, _CRC32C
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path) -> Iterator[bytes]:
    """Each record of a TFRecord file (uncompressed, as TFDS writes them): a little-endian
    uint64 length, its masked CRC32C, the data, the data's masked CRC32C. A truncated or
    corrupt file is a UserError naming it and the record."""
    with open(path, "rb") as f:
        for record in itertools.count(1):
            header = f.read(12)
            if not header:
                return
            whole = len(header) == 12
            if whole:
                length, length_crc = struct.unpack("<QI", header)
                whole = masked_crc32c(header[:8]) == length_crc
            if whole:
                data, footer = f.read(length), f.read(4)
                whole = (len(data) == length and len(footer) == 4
                         and masked_crc32c(data) == struct.unpack("<I", footer)[0])
            if not whole:
                raise UserError(f"{path} is truncated or corrupt at record {record} (its "
                                f"TFRecord checksum does not match); copy or build the "
                                f"dataset again")
            yield data


def write_records(path, records) -> None:
    """A TFRecord file of `records` (bytes), as TensorFlow's TFRecordWriter writes it
    (read_records' framing), written under a temporary name and then renamed."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        for data in records:
            length = struct.pack("<Q", len(data))
            f.write(length + struct.pack("<I", masked_crc32c(length)) + data
                    + struct.pack("<I", masked_crc32c(data)))
    os.replace(tmp, path)


def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # a negative int64 is its two's complement, ten bytes
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def serialize_example(features: dict[str, list[bytes] | list[int]]) -> bytes:
    """A tf.train.Example of {name: a list of bytes (BytesList) or of ints (Int64List,
    packed)}, in the wire format parse_example reads and TensorFlow writes."""
    entries = b""
    for name, values in features.items():
        if all(isinstance(value, bytes) for value in values):
            value_list = b"".join(_length_delimited(1, value) for value in values)
            feature = _length_delimited(1, value_list)  # Feature.bytes_list
        else:
            packed = b"".join(_encode_varint(int(value)) for value in values)
            feature = _length_delimited(3, _length_delimited(1, packed))  # int64_list
        entry = _length_delimited(1, name.encode("utf-8")) + _length_delimited(2, feature)
        entries += _length_delimited(1, entry)  # Features.feature, a map entry
    return _length_delimited(1, entries)  # Example.features


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value) of each field of a protobuf message: an int for
    varints, bytes for the rest. IndexError or ValueError when `buf` is not a message."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        wire = key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        else:
            if wire == 2:
                size, pos = _varint(buf, pos)
            elif wire in (1, 5):
                size = 8 if wire == 1 else 4
            else:
                raise ValueError(f"wire type {wire}")
            if pos + size > len(buf):
                raise ValueError("field past the end")
            value, pos = buf[pos:pos + size], pos + size
        yield key >> 3, wire, value


def _feature_values(feature: bytes) -> list:
    """A tf.train.Feature's values: its BytesList (1), FloatList (2) or Int64List (3)."""
    values = []
    for kind, _, value_list in _fields(feature):
        for number, wire, value in _fields(value_list):
            if number != 1:
                continue
            if kind == 1:
                values.append(value)
            elif kind == 2:  # packed (wire type 2) or one float (5)
                values.extend(struct.unpack(f"<{len(value) // 4}f", value))
            elif kind == 3 and wire == 0:
                values.append(value - (1 << 64) if value >= 1 << 63 else value)
            elif kind == 3:  # packed varints
                pos = 0
                while pos < len(value):
                    item, pos = _varint(value, pos)
                    values.append(item - (1 << 64) if item >= 1 << 63 else item)
    return values


def parse_example(raw: bytes) -> dict[str, list]:
    """A serialized tf.train.Example as {feature name: its values}: bytes, floats or ints.
    ValueError when `raw` is not one."""
    features = {}
    try:
        for number, _, message in _fields(raw):
            if number != 1:  # Example.features
                continue
            for entry_number, _, entry in _fields(message):  # Features.feature, a map
                if entry_number != 1:
                    continue
                name, values = b"", []
                for key, _, value in _fields(entry):
                    if key == 1:
                        name = value
                    elif key == 2:
                        values = _feature_values(value)
                features[name.decode("utf-8")] = values
    except (IndexError, TypeError, struct.error) as error:  # ValueError passes as it is
        raise ValueError(f"not a tf.train.Example ({error})") from None
    return features
