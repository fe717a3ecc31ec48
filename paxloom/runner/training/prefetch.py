"""Prepare the next input batches on a background thread while the device trains.

Each item carries the input pipeline's state *after* that batch, so a checkpoint
taken after consuming batch k records exactly where batch k+1 starts, however
far ahead the thread has read.
"""

import queue
import threading


class Prefetcher:
    def __init__(self, source, to_device, depth: int = 2):
        """`source` has next_batch() and get_state(); `to_device` maps a host batch to arrays."""
        self._source, self._to_device = source, to_device
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="input-prefetch", daemon=True)
        self._thread.start()

    def _fill(self):
        try:
            while not self._stop.is_set():
                batch = self._to_device(self._source.next_batch())
                item = (batch, self._source.get_state(), None)
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as error:  # surfaced on the training thread by next()
            self._queue.put((None, None, error))

    def __next__(self):
        batch, state, error = self._queue.get()
        if error is not None:
            raise error
        return batch, state

    def close(self):
        self._stop.set()
        self._thread.join(timeout=10)
