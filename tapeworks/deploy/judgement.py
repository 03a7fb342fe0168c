"""Whether an artefact gives the model's outputs: tolerances, the task metric, the verdict.

A float artefact (SavedModel, .keras, float32 LiteRT) must give the model's
outputs to rounding: anything else is a bug, refused with its usual cause. A
quantised LiteRT model is another model, close to the float one; it is
judged by the task where held-out data says what the task is (accuracy or
mean squared error against the targets, within `ACCURACY_TOLERANCE` /
`MSE_TOLERANCE` of the model's), and otherwise by an elementwise bound. The
elementwise difference is reported either way.
"""

import dataclasses

import numpy as np

from tapeworks.deploy.report import ExportError

# (rtol, atol) of the artefact's outputs against the in-memory model's. A
# SavedModel runs the traced graph, which TensorFlow's graph optimiser may
# fuse differently from eager execution (a MatMul, its bias and ReLU as one
# kernel): float32 rounding, not a different model. A .keras archive is the
# same Keras layers with the same weights. A float32 LiteRT model runs
# other kernels (XNNPACK) on the same weights.
TOLERANCE = {"saved_model": (1e-4, 1e-5), "keras": (1e-5, 1e-6), "tflite": (1e-4, 1e-5)}
# Without validation data, a quantised LiteRT model's outputs may differ by up
# to this share of the range of the model's outputs on the same inputs (a
# bound that catches a broken conversion, not a measure of quality).
# Measured on a small MLP (one-off): float16 0.03% of the range, int8 0.4%.
RANGE_BOUND = {"float16": 0.01, "dynamic": 0.05, "int8": 0.1}
# With validation data, a quantised model may lose at most 1 point of
# accuracy, or add at most 10% to the mean squared error, against the model's
# own on the same data: what a user of the task would call "the same model".
ACCURACY_TOLERANCE = 0.01
MSE_TOLERANCE = 0.10


class Metric:
    """The task metric of the model and of the artefact on held-out data.

    Accuracy for class scores (a 2-D first output with more than one column)
    against integer labels, else mean squared error.
    """

    def __init__(self, targets, expected):
        self.targets = targets
        first = next(iter(expected.values()))
        self.classes = (first.ndim == 2 and first.shape[1] > 1
                        and np.issubdtype(targets.dtype, np.integer))
        self.name = "accuracy" if self.classes else "mean squared error"
        self.model_value = self.of(expected)
        self.artefact_value = None

    def of(self, outputs):
        first = next(iter(outputs.values()))
        if self.classes:
            return float(np.mean(np.argmax(first, axis=-1) == self.targets.reshape(-1)))
        return float(np.mean((first.reshape(self.targets.shape) - self.targets) ** 2))

    def within_tolerance(self, artefact_value):
        """Whether `artefact_value` is the model's, to the documented tolerance."""
        if self.classes:
            return artefact_value >= self.model_value - ACCURACY_TOLERANCE
        return artefact_value <= self.model_value * (1 + MSE_TOLERANCE) + 1e-12

    def tolerance_text(self):
        return ("at most 1 point of accuracy lost" if self.classes
                else f"at most {MSE_TOLERANCE:.0%} more mean squared error")

    def as_dict(self):
        return {"name": self.name, "model": self.model_value, "artefact": self.artefact_value,
                "tolerance": self.tolerance_text()}


@dataclasses.dataclass
class Verdict:
    """A quantised artefact's comparison with the model; `problem` says why it failed."""

    passed: bool
    differences: dict          # output name -> largest absolute difference
    agreement: float = None    # argmax agreement, for class scores
    metric_value: float = None
    problem: str = ""


def agreement(reference, produced):
    """Share of rows whose argmax agrees, for the first class-score output; None if none."""
    for name, expected in reference.items():
        if expected.ndim == 2 and expected.shape[1] > 1 and name in produced:
            return float(np.mean(np.argmax(produced[name], -1) == np.argmax(expected, -1)))
    return None


def judge(format, quantize, reference, produced, held_out=None, metric=None):
    """The verdict on `produced` (the artefact's outputs) against `reference` (the model's).

    Args:
        reference, produced: {output name: array} on the verification inputs.
        held_out: optional (model's outputs, artefact's outputs) on the
            validation inputs, for the metric and the agreement.
        metric: a `Metric` when validation data were given.

    Raises:
        ExportError: the outputs' names or shapes differ, or a float artefact
            differs beyond rounding (both are bugs, never a quantisation's cost).
    """
    rtol, atol = TOLERANCE[format]
    if sorted(produced) != sorted(reference):
        raise ExportError(
            f"The {format} artefact's outputs are named {sorted(produced)}, the model's "
            f"{sorted(reference)}: nothing was left at the path.")
    differences, problems = {}, []
    for name, expected in reference.items():
        got = produced[name]
        if got.shape != expected.shape:
            raise ExportError(
                f"The {format} artefact's output {name!r} has shape {got.shape}, the model's "
                f"{expected.shape}: nothing was left at the path.")
        difference = float(np.max(np.abs(got.astype(np.float64) - expected))) if got.size \
            else 0.0
        differences[name] = difference
        if quantize is not None:
            bound = RANGE_BOUND[quantize] * float(np.ptp(expected)) if expected.size else 0.0
            if difference > bound:
                problems.append(f"output {name!r} differs by up to {difference:.3g}, over "
                                f"{RANGE_BOUND[quantize]:.0%} of the outputs' range "
                                f"({bound:.3g})")
        elif not np.allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True):
            raise ExportError(
                f"The {format} artefact does not give the model's outputs: output {name!r} "
                f"differs by up to {difference:.3g} (tolerance rtol={rtol}, atol={atol}), on "
                "the same inputs. Nothing was left at the path. The usual cause is a custom "
                "layer whose get_config() does not hold every constructor argument (the "
                "loaded layer is built with the defaults), or a layer that behaves differently "
                "when called again. Fix that layer and export again.")
    verdict = Verdict(passed=not problems, differences=differences,
                      agreement=agreement(*(held_out or (reference, produced))))
    if metric is not None and held_out is not None:
        verdict.metric_value = metric.of(held_out[1])
        if quantize is not None:
            # The task decides; the elementwise bound is reported, not enforced.
            verdict.passed = metric.within_tolerance(verdict.metric_value)
            problems = [] if verdict.passed else [
                f"{metric.name} {verdict.metric_value:.4g} against the model's "
                f"{metric.model_value:.4g} on the validation data (tolerance: "
                f"{metric.tolerance_text()}); largest output difference "
                f"{max(differences.values()):.3g}"]
    verdict.problem = "; ".join(problems)
    return verdict
