"""Magnitude pruning of Keras 3 kernels inside the compiled step.

`Pruning` keeps one mask per pruned kernel in a variable (so a checkpoint
holds it and a pruned run resumes exactly) and acts after every optimizer
update that changed the pruned kernels, in the same graph as the update
(`StepHooks.after_update`, called by the updater; XLA included):

1. its update counter advances;
2. when the schedule says so, each mask is recomputed from the weights'
   magnitudes: the smallest `round(s * n)` of a kernel's `n` weights are
   masked (scope "layer"), or the smallest of all pruned kernels together
   (scope "global"), or the 2 smallest of each 4 along the input channels
   ("2:4");
3. every pruned kernel is multiplied by its mask.

So the model stays a plain Keras model with no wrapper layers (TensorFlow
Model Optimization's wrappers do not run on Keras 3): its masked weights are
exact zeros after every step, and an export writes them as they are. Masked
weights cannot come back: they are zero when the next mask is computed, and
the schedules never lower the sparsity.

Skipped updates (a loss-scale overflow, a withheld non-finite step) change no
weight and advance no counter.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Sequence

import keras
import tensorflow as tf

from tapeworks.engine.checks.gradient_health import Untracked
from tapeworks.engine.step.updater import StepHooks
from tapeworks.errors import ConfigError
from tapeworks.prune.schedule import ConstantSparsity, PolynomialDecay, Schedule

# The layers pruned when `layers` is not given: those whose kernel is the
# bulk of a network's weights and of its multiply-adds.
DEFAULT_LAYERS = (keras.layers.Dense, keras.layers.EinsumDense, keras.layers.Conv1D,
                  keras.layers.Conv2D, keras.layers.Conv3D)
SCOPES = ("layer", "global")
STRUCTURES = (None, "2:4")


def kernel_of(layer):
    """The layer's kernel variable, or None.

    `_kernel` first: Keras' `Dense.kernel` (and Conv's, EinsumDense's) is a
    property that returns a computed tensor, not the variable, when LoRA is
    enabled.
    """
    kernel = getattr(layer, "_kernel", None)
    if kernel is None:
        kernel = getattr(layer, "kernel", None)
    return kernel if isinstance(kernel, keras.Variable) else None


class Pruning(tf.Module, StepHooks):
    """Magnitude pruning for `tapeworks.Trainer(..., pruning=Pruning(...))`.

    Args:
        schedule: a `ConstantSparsity` or `PolynomialDecay`; its steps count
            optimizer updates of the pruned kernels (with `accumulate=k`, one
            per k batches). Default: `ConstantSparsity(0.5)`.
        layers: what to prune: None (every trained Dense, EinsumDense and
            Conv1D/2D/3D layer of the task's models), a list of layers or layer
            names, or a function `layer -> bool`. Every layer named must have
            a kernel that an update trains.
        scope: "layer" (each kernel reaches the sparsity: the default) or
            "global" (one magnitude threshold over all pruned kernels of an
            update: layers with many small weights lose more).
        structure: None, or "2:4": of every 4 consecutive weights along the
            input channels, the 2 smallest are masked (the pattern sparse
            tensor cores run). The sparsity is then 0.5 by construction; the
            schedule says only when masks are recomputed. By default only the
            layers whose input channels are a multiple of 4 are selected.

    Logs: `sparsity` (all pruned kernels) and `sparsity/<layer>` at the end of
    every epoch, measured on the weights (the share of exact zeros).

    Example:
        ```python
        pruning = tapeworks.prune.Pruning(
            tapeworks.prune.PolynomialDecay(0.0, 0.8, begin_step=0, end_step=1000))
        trainer = tapeworks.Trainer(model, "adam", loss, pruning=pruning)
        trainer.fit(x, y, epochs=10)
        pruning.strip()           # masks baked into the weights, ready to export
        ```
    """

    def __init__(self, schedule: Schedule | None = None, *,
                 layers: Sequence[keras.layers.Layer | str]
                 | Callable[[keras.layers.Layer], bool] | None = None,
                 scope: str = "layer", structure: str | None = None) -> None:
        super().__init__(name="pruning")
        if structure not in STRUCTURES:
            raise ConfigError(f"`structure` must be None or \"2:4\". Received: "
                              f"structure={structure!r}")
        if scope not in SCOPES:
            raise ConfigError(f"`scope` must be \"layer\" or \"global\". Received: scope={scope!r}")
        if structure == "2:4" and scope != "layer":
            raise ConfigError("`structure=\"2:4\"` masks each group of 4 weights on its own, so "
                              "there is no global threshold. Fix: drop scope=\"global\".")
        if schedule is None:
            schedule = ConstantSparsity(0.5)
        if not isinstance(schedule, Schedule):
            raise ConfigError(
                f"`schedule` must be a tapeworks.prune.ConstantSparsity or PolynomialDecay. "
                f"Received: {type(schedule).__name__}.")
        if structure == "2:4" and not (isinstance(schedule, ConstantSparsity)
                                       and schedule.target == 0.5):
            raise ConfigError(
                f"`structure=\"2:4\"` prunes exactly half of the weights; the schedule only "
                f"says when. Received: {schedule!r}. Fix: ConstantSparsity(0.5, begin_step=..., "
                "frequency=...), or leave schedule out.")
        if layers is not None and not (callable(layers) or isinstance(layers, (list, tuple))):
            raise ConfigError(
                f"`layers` must be None, a list of layers or layer names, or a function "
                f"layer -> bool. Received: {type(layers).__name__}.")
        self.schedule = schedule
        self.scope = scope
        self.structure = structure
        # The model's layers and variables, held where tf.Module's tracking does
        # not look: a checkpoint of this module holds the masks and the
        # counter only (the kernels are the model's, saved with it).
        self._selection = Untracked([layers])
        self._layers = Untracked([])   # the pruned layers, in Keras' walk order (`build`)
        self._kernels = Untracked([])
        self.masks: list[tf.Variable] = []        # one mask per pruned kernel, same order
        self.step: tf.Variable | None = None      # updates of the pruned kernels so far

    # Built by the Trainer, once the models' variables exist -----------------

    @property
    def built(self) -> bool:
        return self.step is not None

    @property
    def layers(self) -> list[keras.layers.Layer]:
        """The pruned layers, in Keras' walk order (empty until built)."""
        return list(self._layers.items)

    def build(self, models: Sequence[keras.Model], trained: Container[int]) -> None:
        """Selects the layers and creates the masks (all ones) and the counter.

        `trained`: ids of the variables some update trains.
        """
        if self.built:
            return
        from tapeworks.engine.step.task import layers_of

        candidates = [layer for layer in layers_of(models) if kernel_of(layer) is not None]
        chosen = self._select(candidates, layers_of(models), trained)
        if not chosen:
            raise ConfigError(
                "`Pruning` found no layer to prune. Expected at least one trained Dense, "
                "EinsumDense or Conv layer (or the layers named by `layers=`). Fix: name the "
                "layers to prune with `layers=[...]`.")
        self._layers = Untracked(chosen)
        self._kernels = Untracked([kernel_of(layer) for layer in chosen])
        with tf.init_scope():
            self.masks = [tf.Variable(tf.ones(k.shape, k.dtype), trainable=False,
                                      name=f"mask_{layer.name}")
                          for layer, k in zip(chosen, self._kernels.items)]
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="pruning_step")

    def _select(self, candidates, all_layers, trained):
        selection = self._selection.items[0]
        if selection is None:
            chosen = [layer for layer in candidates if isinstance(layer, DEFAULT_LAYERS)
                      and id(kernel_of(layer)) in trained]
            if self.structure == "2:4":
                chosen = [layer for layer in chosen if kernel_of(layer).shape[-2] % 4 == 0]
            return chosen
        if callable(selection):
            chosen = [layer for layer in all_layers if selection(layer)]
        else:
            by_name = {layer.name: layer for layer in all_layers}
            chosen = []
            for item in selection:
                if isinstance(item, str):
                    if item not in by_name:
                        raise ConfigError(
                            f"`layers` names {item!r}, which is not a layer of the trained "
                            f"models. Expected one of the layers with a kernel: "
                            f"{[layer.name for layer in candidates]}.")
                    item = by_name[item]
                if not isinstance(item, keras.layers.Layer):
                    raise ConfigError(f"`layers` must hold layers or layer names. Received: "
                                      f"{type(item).__name__}.")
                chosen.append(item)
        for layer in chosen:
            kernel = kernel_of(layer)
            if kernel is None:
                raise ConfigError(
                    f"Layer {layer.name!r} ({type(layer).__name__}) has no kernel to prune. "
                    "Expected a layer with a `kernel` weight (Dense, Conv, EinsumDense). Fix: "
                    "leave it out of `layers`.")
            if id(kernel) not in trained:
                raise ConfigError(
                    f"Layer {layer.name!r}'s kernel is not trained by any update (frozen, or "
                    "in a helper model), so its mask would never be applied. Fix: leave it "
                    "out of `layers`, or make it trainable.")
            if self.structure == "2:4" and kernel.shape[-2] % 4:
                raise ConfigError(
                    f"Layer {layer.name!r} has {kernel.shape[-2]} input channels; 2:4 "
                    "sparsity groups them by 4. Expected a multiple of 4. Fix: leave the "
                    "layer out of `layers` (it is left out by default).")
        return chosen

    # In the compiled step --------------------------------------------------

    def after_update(self, variables: Iterable[keras.Variable | tf.Variable]) -> None:
        """After an applied update: advance, recompute the masks when due, mask the kernels."""
        updated = {id(v) for v in variables}
        pairs = [(kernel, mask) for kernel, mask in zip(self._kernels.items, self.masks)
                 if id(kernel) in updated]
        if not pairs:
            return
        # Built: masks to apply exist only once `build` created the counter too.
        step = self.step.read_value()  # type: ignore[union-attr]
        self.step.assign_add(1)  # type: ignore[union-attr]
        tf.cond(self.schedule.due(step),
                lambda: self._recompute(pairs, self.schedule.sparsity(step)),
                lambda: None)
        for kernel, mask in pairs:
            kernel.assign(kernel * mask)

    def _recompute(self, pairs, sparsity):
        if self.structure == "2:4":
            for kernel, mask in pairs:
                mask.assign(two_of_four_mask(kernel))
        elif self.scope == "global":
            magnitudes = [tf.abs(tf.convert_to_tensor(k)) for k, _ in pairs]
            everything = tf.concat([tf.reshape(m, [-1]) for m in magnitudes], 0)
            threshold = magnitude_threshold(everything, sparsity)
            for (kernel, mask), magnitude in zip(pairs, magnitudes):
                mask.assign(tf.cast(magnitude > threshold, mask.dtype))
        else:
            for kernel, mask in pairs:
                magnitude = tf.abs(tf.convert_to_tensor(kernel))
                threshold = magnitude_threshold(tf.reshape(magnitude, [-1]), sparsity)
                mask.assign(tf.cast(magnitude > threshold, mask.dtype))

    # On the host -----------------------------------------------------------

    def apply_masks(self) -> None:
        """Sets every masked weight to zero (after an EMA swap, before export).

        `where`, not a product: a non-finite weight times 0 would be NaN.
        """
        for kernel, mask in zip(self._kernels.items, self.masks):
            kernel.assign(tf.where(mask > 0, kernel, tf.zeros_like(kernel)))

    def sparsity(self) -> dict[str, float]:
        """{"sparsity": all pruned kernels, "sparsity/<layer>": each}: shares of exact zeros."""
        logs, zeros, total = {}, 0, 0
        for layer, kernel in zip(self.layers, self._kernels.items):
            size = int(tf.size(kernel))
            layer_zeros = size - int(tf.math.count_nonzero(tf.convert_to_tensor(kernel)))
            logs[f"sparsity/{layer.name}"] = layer_zeros / size
            zeros, total = zeros + layer_zeros, total + size
        logs["sparsity"] = zeros / total if total else 0.0
        return logs

    def strip(self) -> list[keras.layers.Layer]:
        """Bakes the masks into the kernels; returns the pruned layers.

        The model was never wrapped, so there is nothing to unwrap: stripping
        sets the masked weights to zero once more (an EMA optimizer's final
        swap, or training outside the Trainer, may have written non-zeros
        since). Export the model as usual afterwards.
        """
        if not self.built:
            raise ConfigError("`strip` before training: the masks do not exist yet. Expected "
                              "a `Trainer(..., pruning=...)` fit first.")
        self.apply_masks()
        return list(self.layers)


def magnitude_threshold(magnitudes, sparsity):
    """The magnitude at or below which `round(sparsity * n)` of `n` values lie (-1 for none).

    Never all `n`: at most `n - 1` are pruned.

    Masking `magnitude > threshold` prunes exactly that many when magnitudes
    are distinct; zeros (weights pruned before) tie at 0 and are all pruned,
    which never prunes fewer.
    """
    size = tf.size(magnitudes)
    # At most all but one: a tiny kernel at a high sparsity (0.95 of 10 weights
    # rounds to 10) keeps its largest weight rather than vanishing.
    count = tf.minimum(tf.cast(tf.round(sparsity * tf.cast(size, tf.float32)), tf.int32),
                       size - 1)
    ordered = tf.sort(magnitudes)
    at = tf.gather(ordered, tf.maximum(count - 1, 0))
    return tf.where(count > 0, at, tf.constant(-1.0, magnitudes.dtype))


def two_of_four_mask(kernel):
    """The 2:4 mask: of each 4 consecutive weights along the input channels (axis -2), the 2
    largest magnitudes kept."""
    kernel = tf.convert_to_tensor(kernel)
    rank = len(kernel.shape)
    # Input channels last, so groups of 4 are consecutive in a reshape.
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    moved = tf.transpose(tf.abs(kernel), perm)
    groups = tf.reshape(moved, [-1, 4])
    kept = tf.math.top_k(groups, k=2).indices
    mask = tf.reduce_sum(tf.one_hot(kept, 4, dtype=kernel.dtype), axis=1)
    return tf.transpose(tf.reshape(mask, tf.shape(moved)), perm)


__all__ = ["ConstantSparsity", "PolynomialDecay", "Pruning", "two_of_four_mask"]
