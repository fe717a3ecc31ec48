"""Synthetic, learnable token sequences for benchmarks, tests and runs without data.

Each row is an arithmetic progression modulo the vocabulary size with a random
start and a stride from a small set: after two tokens the rest is predictable,
so the loss of a working model falls fast, and a broken one's does not.
"""

import numpy as np

_STRIDES = np.array([1, 2, 3, 5, 7], dtype=np.int64)


def synthetic_rows(seed: int, index: int, rows: int, seq_len: int, vocab_size: int) -> np.ndarray:
    """[rows, seq_len + 1] int32 tokens of global batch `index`, a pure function of its arguments."""
    rng = np.random.default_rng([seed, index])
    start = rng.integers(0, vocab_size, size=(rows, 1))
    stride = rng.choice(_STRIDES, size=(rows, 1))
    return ((start + stride * np.arange(seq_len + 1)) % vocab_size).astype(np.int32)


def as_batch(tokens: np.ndarray) -> dict[str, np.ndarray]:
    """The model's batch dict from [rows, seq_len + 1] tokens: every position is a real token."""
    rows, length = tokens.shape[0], tokens.shape[1] - 1
    ones = np.ones((rows, length), np.float32)
    return {
        "ids": tokens[:, :-1],
        "labels": tokens[:, 1:],
        "weights": ones,
        "paddings": np.zeros_like(ones),
        "segment_ids": np.ones((rows, length), np.int32),
        "segment_pos": np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy(),
    }


class SyntheticTrainInput:
    """Endless synthetic batches; this process gets rows `process_rows` of each global batch."""

    def __init__(self, *, seq_len: int, vocab_size: int, seed: int, global_batch_size: int,
                 process_rows: tuple[int, int]):
        self.seq_len, self.vocab_size, self.seed = seq_len, vocab_size, seed
        self.global_batch_size = global_batch_size
        self.process_rows = process_rows
        self.batch_index = 0

    def next_batch(self) -> dict[str, np.ndarray]:
        tokens = synthetic_rows(self.seed, self.batch_index, self.global_batch_size,
                                self.seq_len, self.vocab_size)
        self.batch_index += 1
        start, stop = self.process_rows
        return as_batch(tokens[start:stop])

    def get_state(self) -> dict:
        return {"batch_index": self.batch_index, "seed": self.seed}

    def set_state(self, state: dict) -> None:
        self.batch_index = int(state["batch_index"])


class SyntheticEvalInput:
    """A fixed set of `num_batches` synthetic batches (drawn with a seed apart from training's)."""

    def __init__(self, *, seq_len: int, vocab_size: int, seed: int, num_batches: int,
                 global_batch_size: int, process_rows: tuple[int, int]):
        self.seq_len, self.vocab_size, self.seed = seq_len, vocab_size, seed
        self.num_batches = num_batches
        self.global_batch_size = global_batch_size
        self.process_rows = process_rows

    def __iter__(self):
        start, stop = self.process_rows
        for index in range(self.num_batches):
            tokens = synthetic_rows(self.seed, index, self.global_batch_size, self.seq_len,
                                    self.vocab_size)
            yield as_batch(tokens[start:stop])
