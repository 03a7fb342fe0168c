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

import inspect

import keras
import tensorflow as tf

from tapeworks.engine.step.task import layers_of
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
        acting = acts_by_mode(layer) if names else []
        if not acting:
            continue   # nothing trained, or nothing the mode changes: nothing true to say
        count = len(layer.trainable_variables)
        warn(f"tapeworks: `{layer.name}` is called with training=False inside the training "
             f"step, yet its {count} trainable variable(s) are updated by "
             f"{', '.join(repr(n) for n in sorted(names))}: it runs in inference mode "
             f"({_named(acting)}: BatchNormalization keeps its statistics, Dropout is off) "
             "while the optimizer changes its weights. Fix: if it is a "
             f"frozen feature extractor, set `{layer.name}.trainable = False` before building "
             "the Trainer (or `Task.freeze` it); if fine-tuning in inference mode is meant, "
             "pass `Trainer(fine_tune_in_inference_mode=True)`.", CorrectnessWarning,
             section="inference-mode")


def built_in_inference(models):
    """Layers a Functional model was built calling with `training=False` (`encoder(x, training=False)`).

    Keras 3 does not keep that argument: under `fit` the outer call's
    `training=True` reaches them (tests/engine/checks/test_inference_mode.py), so
    the call site the user wrote never shows at trace time. Read from the
    model's graph (`_nodes_by_depth`: Keras' own record of each call and
    its arguments; there is no public accessor). A layer whose `call` has a
    `training` default of its own (an LSTM's `training=False`) is left out:
    Keras fills that default into the recorded call when the user passed
    nothing, so the False there is not the user's.
    """
    found = []
    for model in layers_of(models, include_self=True):
        for nodes in getattr(model, "_nodes_by_depth", {}).values():
            for node in nodes:
                layer = node.operation
                if (node.arguments.kwargs.get("training") is False
                        and isinstance(layer, keras.layers.Layer) and layer not in found
                        and not has_training_default(layer)):
                    found.append(layer)
    return found


def has_training_default(layer):
    """Whether `layer.call` gives `training` a default other than None (Keras then fills it in)."""
    parameter = _parameters(layer.call).get("training")
    return parameter is not None and parameter.default not in (None, inspect.Parameter.empty)


def check_built(models, updates):
    """Warns about layers built with training=False whose trainable variables an update trains.

    Only where the mode changes something in them (`acts_by_mode`): an
    encoder of Dense layers alone computes the same either way, and the
    warning would have nothing true to say.
    """
    trained = {id(v) for update in updates for v in update.variables()}
    for layer in built_in_inference(models):
        count = sum(id(v) in trained for v in layer.trainable_variables)
        acting = acts_by_mode(layer) if count else []
        if not acting:
            continue
        named = _named(acting)
        batchnorm = any(isinstance(a, keras.layers.BatchNormalization) for a in acting)
        keep_batchnorm = (
            "; to fine-tune it with its BatchNormalization in inference mode (what that "
            "training=False asked for, as in Keras' transfer-learning guide), set "
            "`trainable = False` on each BatchNormalization layer in it (Keras 3 runs a frozen "
            "BatchNormalization in inference mode)" if batchnorm else "")
        warn(f"tapeworks: `{layer.name}` was called with training=False when its Functional "
             f"model was built, but its {count} trainable variable(s) are trained, and Keras 3 "
             "does not keep that training=False: under fit the outer training=True reaches "
             f"`{layer.name}`, so it is fine-tuned in training mode, {named} included "
             "(BatchNormalization statistics move, Dropout drops). Fix: if it is a "
             f"frozen feature extractor, set `{layer.name}.trainable = False` before building "
             f"the Trainer{keep_batchnorm}; if fine-tuning in training mode is meant, pass "
             "`Trainer(fine_tune_in_inference_mode=True)`.", CorrectnessWarning,
             section="inference-mode")


def _named(layers):
    named = ", ".join(f"{type(a).__name__} `{a.name}`" for a in layers[:3])
    return named + (f" and {len(layers) - 3} more" if len(layers) > 3 else "")


def acts_by_mode(layer):
    """The layers inside `layer` (itself included) that compute differently in training mode.

    A trainable BatchNormalization (a frozen one runs in inference mode in
    Keras 3 whatever it is told) and SpectralNormalization; a dropout or
    noise layer, or a recurrent cell, with a rate above zero; Keras' random
    augmentations; a `Lambda` whose function takes `training`; and any layer
    of the user's whose `call` takes `training`, since what it does with it
    cannot be read. Keras' other layers that take `training` (Dense,
    EinsumDense: for LoRA and quantization) compute the same either way.
    Layers that hold other layers (a model, an RNN around its cell, a
    wrapper) count through what they hold.
    """
    return [inner for inner in layers_of([layer], include_self=True)
            if not list(inner._flatten_layers(include_self=False, recursive=False))
            and _acts_by_mode(inner)]


# Keras' image augmentations whose names do not start with "Random".
_KERAS_AUGMENTATIONS = ("AugMix", "CutMix", "MixUp", "RandAugment", "Solarization")


def _acts_by_mode(layer):
    if isinstance(layer, keras.layers.BatchNormalization):
        return layer.trainable
    rates = [getattr(layer, name) for name in ("rate", "stddev", "dropout", "recurrent_dropout")
             if isinstance(getattr(layer, name, None), (int, float))]
    if rates:
        return any(rate > 0 for rate in rates)
    if isinstance(layer, keras.layers.Lambda):
        return "training" in _parameters(layer.function)
    if type(layer).__module__.startswith("keras."):
        name = type(layer).__name__
        return (isinstance(layer, keras.layers.SpectralNormalization)
                or name.startswith("Random") or name in _KERAS_AUGMENTATIONS)
    return "training" in _parameters(layer.call)


def _parameters(function):
    try:
        return inspect.signature(function).parameters
    except (TypeError, ValueError):
        return {}


def check_frozen_batchnorm(models):
    """Warns about frozen BatchNormalization layers whose statistics were never computed.

    A frozen (trainable=False) BatchNormalization runs in inference mode with
    its moving statistics; if those still hold their initial values (mean 0,
    variance 1 everywhere), it normalises nothing: usually it was frozen
    before it was trained, or before pretrained weights were loaded.
    """
    unset = []
    for layer in layers_of(models):
        if not isinstance(layer, keras.layers.BatchNormalization) or layer.trainable:
            continue
        with tf.init_scope():   # called while the step is traced: read the values eagerly
            mean, variance = layer.moving_mean.numpy(), layer.moving_variance.numpy()
        if (mean == 0).all() and (variance == 1).all():
            unset.append(layer.name)
    if not unset:
        return
    # One warning for them all: a frozen base of 52 such layers (MobileNetV2
    # built without its weights) is one mistake, not 52.
    if len(unset) == 1:
        which, them = f"BatchNormalization `{unset[0]}` is", f"`{unset[0]}`"
    else:
        shown = ", ".join(f"`{name}`" for name in unset[:3])
        more = f" and {len(unset) - 3} more" if len(unset) > 3 else ""
        which = f"{len(unset)} BatchNormalization layers ({shown}{more}) are"
        them = "them"
    warn(f"tapeworks: {which} frozen (trainable=False), so they run in inference mode with "
         "their moving statistics, and those were never computed (mean 0 and variance 1, "
         "their initial values): they do not normalise their input. Fix: load the "
         f"pretrained weights (or train them) before freezing, or leave {them} trainable so "
         "the statistics follow the data.", CorrectnessWarning, section="inference-mode")
