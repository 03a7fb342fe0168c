"""Progress display for `fit`: Keras' `Progbar`, plus samples per second."""

import sys
import time

import keras


def resolve_verbose(verbose):
    """"auto" -> 1 (a live bar) on a terminal, 2 (a line per epoch) otherwise."""
    if verbose == "auto":
        return 1 if sys.stdout.isatty() else 2
    if verbose not in (0, 1, 2):
        from tapeworks.errors import ConfigError

        raise ConfigError(
            f"`verbose` must be 0, 1, 2 or \"auto\". Received: verbose={verbose!r}"
        )
    return verbose


class EpochProgress:
    """One epoch's bar: steps done, ETA (from Progbar), metrics and samples/s.

    With several steps per call the bar moves once per call, which is also
    when the logs are read from the device.
    """

    def __init__(self, epoch, epochs, steps, verbose):
        self._verbose = verbose
        self._start = time.perf_counter()
        self._bar = None
        if verbose:
            print(f"Epoch {epoch + 1}/{epochs}")
            # All values shown are running results already, so none is
            # averaged again by Progbar.
            self._bar = keras.utils.Progbar(
                steps, verbose=verbose, stateless_metrics=(), unit_name="step"
            )

    def update(self, steps_done, samples_done, logs, finalize=False):
        if self._bar is None:
            return
        seconds = max(time.perf_counter() - self._start, 1e-9)
        values = list(logs.items()) + [("samples/s", samples_done / seconds)]
        self._bar.update(steps_done, values=values, finalize=finalize)
