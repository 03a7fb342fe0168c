"""A trainable sub-model called in inference mode inside the training step: named, once.

`encoder(x, training=False)` is how a pretrained feature extractor is used:
BatchNormalization keeps its statistics and Dropout is off. If the encoder's
variables are still trainable, the optimizer updates them anyway, which is
rarely what the code meant (Keras' transfer-learning guide sets
`encoder.trainable = False` first). While the training step is traced (once,
at trace time: nothing runs per step), every layer's `call` records the
`training` it was given; the outermost layers called with `training=False`
whose trainable variables an update trains are reported, unless the Trainer
was told fine-tuning in inference mode is meant
(`Trainer(fine_tune_in_inference_mode=True)`).
"""

import keras

from tapeworks.engine.task import layers_of
from tapeworks.errors import CorrectnessWarning, warn


class InferenceCalls:
    """A context manager: the outermost layers called with `training=False` while open.

    What counts is the argument at the call site, so `Layer.__call__` (the
    class's; Python looks special methods up on the type) is wrapped while the
    context is open, for the layers of `models` only. Keras passes the
    resolved `training` on to `call` (and a Functional model overrides a
    built-in `training=False` with the outer call's value), which is why the
    call site, not `call`, is looked at.
    """

    def __init__(self, models):
        self._ids = {id(layer) for layer in layers_of(models, include_self=True)}
        self.found = []         # layers, outermost first, no duplicates
        self._inside = 0        # depth of calls under a training=False call
        self._original = None

    def __enter__(self):
        self._original = original = keras.layers.Layer.__call__
        watch = self

        def call(layer, *args, **kwargs):
            inference = kwargs.get("training") is False and id(layer) in watch._ids
            if inference and not watch._inside and layer not in watch.found:
                watch.found.append(layer)
            watch._inside += inference
            try:
                return original(layer, *args, **kwargs)
            finally:
                watch._inside -= inference

        keras.layers.Layer.__call__ = call
        return self

    def __exit__(self, *exc):
        keras.layers.Layer.__call__ = self._original
        return False


def check(found, updates):
    """Warns about each layer in `found` whose trainable variables an update trains."""
    trained = {id(v): update.name for update in updates for v in update.variables()}
    for layer in found:
        names = {trained[id(v)] for v in layer.trainable_variables if id(v) in trained}
        if not names:
            continue
        count = len(layer.trainable_variables)
        warn(f"tapeworks: `{layer.name}` is called with training=False inside the training "
             f"step, yet its {count} trainable variable(s) are updated by "
             f"{', '.join(repr(n) for n in sorted(names))}: BatchNormalization and Dropout "
             "run in inference mode while the optimizer changes its weights. Fix: if it is a "
             f"frozen feature extractor, set `{layer.name}.trainable = False` before building "
             "the Trainer (or `Task.freeze` it); if fine-tuning in inference mode is meant, "
             "pass `Trainer(fine_tune_in_inference_mode=True)`.", CorrectnessWarning)
