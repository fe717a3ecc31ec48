"""How context parallelism lays each sequence over the context axis.

With causal attention, token t attends to the t + 1 tokens up to it, so the last of N
contiguous pieces of a sequence does 2N - 1 times the work of the first. Cut into 2N
chunks, shard i takes chunks i and 2N - 1 - i: every shard then does the same causal work
(Megatron's and torchtitan's head-tail order, MaxText's load balancing). The train step
lays each batch out in this order before the model (paxloom/runner/training/trainer.py), and the
context-parallel attention reads the same order (layers/attention.py): the only two
places that know it. Every token keeps its position and document, so the loss, a sum over
tokens, does not depend on the order.
"""

import numpy as np

from paxloom.core.errors import UserError


def load_balanced_order(seq_len: int, shards: int) -> np.ndarray:
    """The natural token indices [seq_len] in their laid-out order: shard i holds the
    contiguous block i of the result, chunks i and 2 * shards - 1 - i of the sequence."""
    check_divisible(seq_len, shards)
    chunks = np.arange(seq_len).reshape(2 * shards, -1)
    return np.concatenate([np.concatenate([chunks[i], chunks[2 * shards - 1 - i]])
                           for i in range(shards)])


def causal_work(order: np.ndarray, shards: int) -> list[int]:
    """The (query, key) pairs causal attention computes on each shard, when the tokens are
    laid out in `order` and split into `shards` contiguous blocks: the query at natural
    position p attends to p + 1 keys."""
    return [int(np.sum(block + 1)) for block in np.split(np.asarray(order), shards)]


def check_divisible(seq_len: int, shards: int) -> None:
    """UserError unless the sequence cuts into 2 x `shards` equal chunks."""
    if shards > 1 and seq_len % (2 * shards):
        raise UserError(
            f"MAX_SEQ_LEN={seq_len} does not cut into 2 x {shards} equal chunks for "
            f"{shards}-way context parallelism (the context entry of ICI_MESH_SHAPE x "
            f"DCN_MESH_SHAPE); use a multiple of {2 * shards}, e.g. "
            f"{-(-seq_len // (2 * shards)) * 2 * shards}")
