"""The one switch every corpus script shares: whose `fit` trains, and what the run printed.

Each script in this folder is a TensorFlow tutorial or a Keras example with
its data swapped for synthetic stand-ins; its one `model.fit(...)` call is
written `corpus_fit.fit(model, ...)` with the original arguments, and
`corpus_fit.report(history)` ends the script. The switch is the
environment:

- `TAPEWORKS_CORPUS_FIT=keras` (the default): `model.fit(...)`, Keras' own.
- `TAPEWORKS_CORPUS_FIT=tapeworks`: `tapeworks.Trainer(model).fit(...)` with
  the same arguments, as the README's one-minute tour changes it.
- `TAPEWORKS_CORPUS_SIZE=small` (the default) or `tiny`: how much synthetic
  data and how many epochs (`size(small=..., tiny=...)` picks).

This module is imported before TensorFlow, as a tapeworks user imports
tapeworks before building a model, so tapeworks' XLA cache is on in that
mode (see tapeworks/xla_cache.py). The last line a script prints is one
JSON object: `fit` ("keras" or "tapeworks"), `history_keys` (sorted),
`final_loss` (the last epoch's `loss`, or of the first key that names a loss
where the History has no `loss`; null where none does), `fit_seconds` (the wall time of the
`fit` call alone) and `warnings` (the text of each tapeworks warning shown
during the run, in order, each once).
"""

import json
import os
import time
import warnings

FIT = os.environ.get("TAPEWORKS_CORPUS_FIT", "keras")
SIZE = os.environ.get("TAPEWORKS_CORPUS_SIZE", "small")
if FIT not in ("keras", "tapeworks"):
    raise SystemExit(f"TAPEWORKS_CORPUS_FIT must be 'keras' or 'tapeworks'. Received: {FIT!r}. "
                     "Fix: unset it (Keras' fit) or set it to one of those.")
if SIZE not in ("small", "tiny"):
    raise SystemExit(f"TAPEWORKS_CORPUS_SIZE must be 'small' or 'tiny'. Received: {SIZE!r}. "
                     "Fix: unset it (small) or set it to one of those.")
if FIT == "tapeworks":
    import tapeworks   # before TensorFlow starts: the XLA cache's flag is read then
    # Imported here, as a script's imports are, not inside the timed `fit`:
    # `tapeworks.Trainer` is imported on first use, and Keras' trainer is
    # imported with `keras` (outside the clock too).
    from tapeworks import Trainer

_shown = []
_show = warnings.showwarning


def _record(message, category, filename, lineno, file=None, line=None):
    # Recorded where Python shows it (after its filters), so the list holds
    # what the user saw; the warning is still shown as usual.
    if FIT == "tapeworks" and issubclass(category, tapeworks.TapeworksWarning):
        text = f"{category.__name__}: {message}"
        if text not in _shown:
            _shown.append(text)
    _show(message, category, filename, lineno, file, line)


warnings.showwarning = _record

import keras  # noqa: E402  (after tapeworks, as above)

# Seeded, so both switches start from the same weights and data.
keras.utils.set_random_seed(0)

_fit_seconds = None


def size(small, tiny):
    """`small` at TAPEWORKS_CORPUS_SIZE=small (the default), else `tiny`."""
    return small if SIZE == "small" else tiny


def fit(model, *args, **kwargs):
    """`model.fit(*args, **kwargs)`, or tapeworks' `Trainer(model).fit` with the same arguments."""
    global _fit_seconds
    start = time.perf_counter()
    if FIT == "keras":
        history = model.fit(*args, **kwargs)
    else:
        history = Trainer(model).fit(*args, **kwargs)
    _fit_seconds = time.perf_counter() - start
    return history


def report(history):
    """Prints the run's one JSON line (see the module's docstring)."""
    # A History without "loss" (a GAN's d_loss and g_loss, a train_step that
    # returns metrics only): its first key that names a loss, else None.
    key = "loss" if "loss" in history.history else next(
        (k for k in sorted(history.history) if "loss" in k), None)
    losses = history.history.get(key) or [None]
    print(json.dumps({"fit": FIT, "history_keys": sorted(history.history),
                      "final_loss": None if losses[-1] is None else float(losses[-1]),
                      "fit_seconds": _fit_seconds, "warnings": list(_shown)}))
