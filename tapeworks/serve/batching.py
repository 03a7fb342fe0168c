"""Dynamic batching: concurrent requests to one signature of one version, run as one call.

A `Batcher` takes requests (each {input: array} with the same leading size)
into a bounded queue. Its worker task takes every request waiting (up to
`max_batch_size` rows), and with `timeout` > 0 waits up to that long for
more; with 0 (the default, TF Serving's advice for CPUs) it runs at once, and
batches form while the previous batch runs: one client pays no wait, many
clients share calls. It concatenates them, pads the batch up to the next bucket (powers of two up to
`max_batch_size`, TF Serving's `allowed_batch_sizes` idea: a few shapes, so
TensorFlow's and oneDNN's per-shape caches stay warm), runs the signature in
the thread pool (TensorFlow releases the GIL; the event loop keeps
accepting), and hands each request its own rows of the outputs. A full
queue refuses at once (`QueueFull`: 503 with Retry-After), so a burst
cannot grow latency without bound.
"""

import asyncio
import collections

import numpy as np


class QueueFull(Exception):
    pass


def buckets(max_batch_size):
    sizes, size = [], 1
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    return sizes + [max_batch_size]


def _pad(array, rows):
    if rows == len(array):
        return array
    filler = np.repeat(array[-1:], rows - len(array), axis=0)   # a real row: no NaN paths
    return np.concatenate([array, filler])


class Batcher:
    def __init__(self, run, *, max_batch_size, timeout, max_queue, executor, on_batch=None):
        self._run = run                  # {input: array} -> {output: array}, blocking
        self.max_batch_size = max_batch_size
        self.timeout = timeout
        self.max_queue = max_queue
        self._executor = executor
        self._on_batch = on_batch        # called with (rows, padded rows) per batch
        self._buckets = buckets(max_batch_size)
        self._waiting = collections.deque()
        self._wake = None
        self._worker = None

    @property
    def depth(self):
        return len(self._waiting)

    async def submit(self, inputs, rows):
        """Runs `inputs` ({name: array} of `rows` rows) in a batch; returns its outputs."""
        loop = asyncio.get_running_loop()
        if rows > self.max_batch_size:
            # Larger than a batch: it runs alone, as it came.
            return await loop.run_in_executor(self._executor, self._run, inputs)
        if len(self._waiting) >= self.max_queue:
            raise QueueFull()
        future = loop.create_future()
        self._waiting.append((inputs, rows, future))
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._work())
        return await future

    async def _work(self):
        loop = asyncio.get_running_loop()
        while True:
            if not self._waiting:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=5.0)
                except asyncio.TimeoutError:
                    if not self._waiting:
                        return   # idle: a new request starts a new worker
                continue
            deadline = loop.time() + self.timeout
            batch, rows = [], 0
            while True:
                while self._waiting and rows + self._waiting[0][1] <= self.max_batch_size:
                    item = self._waiting.popleft()
                    batch.append(item)
                    rows += item[1]
                remaining = deadline - loop.time()   # <= 0 at once when timeout is 0
                if rows >= self.max_batch_size or remaining <= 0 or (
                        self._waiting and rows + self._waiting[0][1] > self.max_batch_size):
                    break
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=remaining)
                except asyncio.TimeoutError:
                    pass
            await self._run_batch(batch, rows, loop)

    async def _run_batch(self, batch, rows, loop):
        padded = next(b for b in self._buckets if b >= rows)
        names = list(batch[0][0])
        inputs = {n: _pad(np.concatenate([item[0][n] for item in batch]), padded)
                  for n in names}
        try:
            outputs = await loop.run_in_executor(self._executor, self._run, inputs)
        except Exception as error:   # noqa: BLE001 - every waiting request gets the error
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        if self._on_batch is not None:
            self._on_batch(rows, padded)
        start = 0
        for inputs_, count, future in batch:
            if not future.done():
                future.set_result({k: v[start:start + count] for k, v in outputs.items()})
            start += count
