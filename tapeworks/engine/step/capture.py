"""Copying chosen tensors out of the compiled step every k steps, without `predict()`.

Inside `compute_losses`, `self.capture("fake", fake)` names a tensor. With
`Trainer(..., capture_every=k)` the loop (outside XLA) copies the named
tensors into buffer variables on every k-th step only; after the call the host
reads them, once, and hands them to every callback that has an
`on_capture(step, tensors)` method (`CaptureCallback` wraps a function).
Steps per call are capped at k, so no capture is overwritten before it is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tapeworks.engine.step import control_flow


class Capture(tf.Module):
    """Buffers for the captured tensors, and the step they come from."""

    def __init__(self, specs, every):
        super().__init__(name="capture")
        self.every = every
        self.step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="captured_step")
        self.buffers = {
            name: tf.Variable(tf.zeros([d or 0 for d in spec.shape], spec.dtype),
                              shape=tf.TensorShape(None), trainable=False, name=f"buffer_{i}")
            for i, (name, spec) in enumerate(sorted(specs.items()))}

    def maybe_record(self, step, tensors):
        """In the graph: keeps `tensors` if `step` (0-based) is a k-th step."""

        def record():
            for name, tensor in tensors.items():
                self.buffers[name].assign(tensor)
            self.step.assign(step)

        control_flow.cond((step + 1) % self.every == 0, record, lambda: None)

    def read(self):
        return int(self.step.numpy()), {name: b.numpy() for name, b in self.buffers.items()}


class CaptureDelivery:
    """Hands newly captured tensors to callbacks with `on_capture` (one read per capture)."""

    def __init__(self, capture):
        self.capture = capture
        self.delivered = -1

    def after_call(self, callbacks):
        if self.capture is None:
            return
        if int(self.capture.step.numpy()) == self.delivered:
            return
        step_index, tensors = self.capture.read()
        self.delivered = step_index
        for callback in callbacks:
            if hasattr(callback, "on_capture"):
                callback.on_capture(step_index, tensors)


class CaptureCallback(keras.callbacks.Callback):
    """Calls `fn(step, tensors)` with the tensors captured every `capture_every` steps."""

    def __init__(self, fn: Callable[[int, dict[str, np.ndarray]], Any]) -> None:
        super().__init__()
        self.fn = fn

    def on_capture(self, step: int, tensors: dict[str, np.ndarray]) -> None:
        """Called with the step index and the captured tensors (name -> NumPy array)."""
        self.fn(step, tensors)
