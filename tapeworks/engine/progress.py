"""Progress display for `fit`: Keras' `Progbar`, with samples per second beside the step time."""

import logging
import sys
import time

import keras

logger = logging.getLogger("tapeworks")


def announce(line, verbose):
    """A choice or a fallback of tapeworks' own: printed at verbose >= 1, logged always."""
    if verbose:
        print(f"tapeworks: {line}")
    logger.info("%s", line)


def resolve_verbose(verbose: object) -> int:
    """"auto" -> 1 (a live bar) on a terminal, 2 (a line per epoch) otherwise.

    Keras' "auto" is always 1; off a terminal a live bar fills log files
    with redrawn lines, so tapeworks writes one line per epoch there.
    """
    if verbose == "auto":
        return 1 if sys.stdout.isatty() else 2
    if verbose not in (0, 1, 2):
        from tapeworks.errors import ConfigError

        raise ConfigError(
            f"`verbose` must be 0, 1, 2 or \"auto\". Received: verbose={verbose!r}"
        )
    return verbose


class _Progbar(keras.utils.Progbar):
    """Keras' bar, with samples/s written after the time per step, rounded.

    Keras prints every value with four decimals (`samples/s: 113.1596`); the
    rate is shown where Keras shows `3ms/step`, as a whole number. Progbar
    has no other place to format one value its own way.
    """

    samples_per_second = None
    status = None   # "tuning 1/3" while "auto" measures

    def _format_time(self, time_per_unit, unit_name):
        text = super()._format_time(time_per_unit, unit_name)
        if self.samples_per_second is not None:
            text += f" - {self.samples_per_second:,.0f} samples/s"
        if self.status:
            text += f" - {self.status}"
        return text


class EpochProgress:
    """One epoch's bar: steps done, ETA, time per step, samples/s and the logs.

    With several steps per call the bar moves once per call, which is also
    when the logs are read from the device.
    """

    def __init__(self, epoch, epochs, steps, verbose):
        self._start = time.perf_counter()
        self._bar = None
        if verbose:
            if epochs > 1:   # Keras' ProgbarLogger heads no fit of one epoch
                print(f"Epoch {epoch + 1}/{epochs}")
            # All values shown are running results already, so none is
            # averaged again by Progbar.
            self._bar = _Progbar(steps, verbose=verbose, stateless_metrics=(),
                                 unit_name="step")

    def update(self, steps_done, samples_done, logs, status=None, finalize=False):
        if self._bar is None:
            return
        seconds = max(time.perf_counter() - self._start, 1e-9)
        self._bar.samples_per_second = samples_done / seconds
        if not finalize:
            self._bar.status = status
        # Per-layer monitor values (`gradient_norm/<layer>`) go to the logs,
        # TensorBoard and `trainer.monitor_history`, not the bar.
        values = [(k, v) for k, v in logs.items() if "/" not in k]
        self._bar.update(steps_done, values=values, finalize=finalize)

    def finish(self, steps_done, samples_done, logs):
        """The epoch's last line, with what the callbacks added to `logs` at epoch end.

        An epoch of data of unknown length ends with the steps it ran as the
        bar's target, as Keras' ProgbarLogger does: verbose=2 prints its one
        line only for a bar with a target.
        """
        if self._bar is not None and self._bar.target is None:
            self._bar.target = steps_done
        self.update(steps_done, samples_done, logs, self._bar.status if self._bar else None,
                    finalize=True)
