"""A process' resident memory: now, and its peak over a span (for the memory scenarios)."""

import resource
import threading
import time


def rss_bytes():
    """This process' resident set size now, in bytes (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


class PeakSampler:
    """Samples this process' resident memory every few milliseconds, in a thread.

    `ru_maxrss` cannot be used: it is the peak since the process started, and
    importing TensorFlow can peak higher than a small training run.

    Example:
        before = rss_bytes()
        with PeakSampler() as sampler:
            trainer.fit(dataset, verbose=0)
        training_bytes = sampler.peak - before
    """

    def __init__(self, interval=0.002):
        self.interval = interval
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
