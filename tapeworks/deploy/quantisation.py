"""When an int8 model fails its verification: which layers lose the accuracy, and the repair.

Per-tensor int8 gives each activation 256 steps between its calibrated
minimum and maximum. A tensor whose range is set by rare large values (a
normalisation of pixels that are almost never lit, one feature a thousand
times the others) leaves its common values a few steps, or none; a constant
with such a range (a normalisation's 1/std of a pixel that never varies)
rounds its ordinary entries to zero. `localise` measures, for every
quantised op, the error it adds (TensorFlow's NumericVerify: its int8 output
against the same op in float on float inputs) against the spread of its
float output, and ranks the ops by that ratio. `repair` keeps the worst ones
in float32, one more at a time in that order, until the model passes the
same verification, then puts back into int8 any of them it passes without.
"""

import dataclasses
import math
import re

# What makes a float16 or dynamic-range layer depart from float32, for the refusal.
CAUSES = {
    "float16": "a weight or an activation beyond float16's range (65,504), or values that "
               "need more than its 11 bits of precision (a large sum of nearly equal terms).",
    "dynamic": "its inputs are quantised to int8 as it runs, per batch: input features of "
               "very different scales (one a thousand times the rest) leave the others a "
               "step or none (normalise them first); its int8 weights lose the small ones "
               "beside a weight far larger than the rest of its channel."}

REPAIR_TRIES = 8   # candidate models tried (1, 2, ... of the worst ops in float) before refusing


@dataclasses.dataclass(frozen=True)
class LayerError:
    """One quantised op's damage: where it is, its int8 range, the error it adds."""

    layer: str             # the Keras layer the op belongs to (or the output tensor's name)
    op: str                # the LiteRT op, e.g. "FULLY_CONNECTED"
    tensor: str            # its output tensor in the calibrated model (a denylisted node)
    low: float             # the int8 activation range, calibrated
    high: float
    error: float           # rms error the op adds in int8, in its output's units
    spread: float          # rms of its float output about the mean
    preprocessing: bool    # the layer belongs to `export`'s preprocessing

    @property
    def relative(self):
        """The error against the signal; rounding alone gives about step / sqrt(12)."""
        if self.spread and math.isfinite(self.spread):
            return self.error / self.spread
        width = self.high - self.low
        return self.error / width if width else 0.0

    @property
    def beyond_rounding(self):
        """The error is far more than rounding to its own steps gives (step / sqrt(12)):
        what the op loses is in its inputs or constants (a 1/std of a pixel that never
        varies), not in its output's range."""
        return self.error > 4 * (self.high - self.low) / 255 / math.sqrt(12)

    def __str__(self):
        step = (self.high - self.low) / 255
        where = ", preprocessing" if self.preprocessing else ""
        cause = (f"; rounding to those steps alone gives {step / math.sqrt(12):.2g}: the op "
                 "loses it in its int8 inputs or constants" if self.beyond_rounding else "")
        return (f"{self.layer} ({self.op}{where}): int8 activations in [{self.low:.3g}, "
                f"{self.high:.3g}] (steps of {step:.3g}), adds an rms error of "
                f"{self.error:.3g}, {self.relative:.0%} of its output's spread "
                f"({self.spread:.3g}){cause}")


def localise(calibration, layer_names, preprocessing_names, output_layers=None):
    """[LayerError] of every quantised op of an `Int8Calibration`, worst first.

    `output_layers` maps the signature's outputs to the layers that compute
    them, where known: an output tensor is named after the signature
    ("StatefulPartitionedCall:0"), not after its layer.
    """
    layers = []
    for op in calibration.ops:
        layer = (output_layers or {}).get(op["output"]) or layer_of(op["tensor"], layer_names)
        layers.append(LayerError(layer=layer, op=op["op"], tensor=op["tensor"], low=op["low"],
                                 high=op["high"], error=op["error"], spread=op["spread"],
                                 preprocessing=layer in preprocessing_names))
    return sorted(layers, key=lambda layer: layer.relative, reverse=True)


def layer_of(tensor, layer_names):
    """The Keras layer a converted tensor belongs to, from its name scopes.

    A tensor is named after the ops fused into it, each by its scopes:
    "sequential_1/dense_1/MatMul;sequential_1/dense_1/Relu". TensorFlow
    uniquifies a traced layer's scope within its graph, so the layer "dense"
    is traced as "dense_1" and "dense_1" as "dense_1_2": the name without its
    last "_<n>" is tried first. A tensor with no layer in its name is named
    as itself.
    """
    for fused in tensor.split(";"):
        scopes = fused.split("/")[:-1]
        for scope in reversed(scopes):
            for candidate in (re.sub(r"_\d+$", "", scope), scope):
                if candidate in layer_names:
                    return candidate
    return f"tensor {tensor}"


@dataclasses.dataclass(frozen=True)
class LayerDrift:
    """Where a float16 or dynamic-range model departs from float32: one layer's output."""

    layer: str
    tensor: str            # its output tensor in the LiteRT model
    relative: float        # the worst channel's rms error against that channel's spread
    error: float
    spread: float
    before: float          # the largest `relative` of any layer that runs before it
    preprocessing: bool

    @property
    def added(self):
        """How much more than any earlier layer's output this one's departs."""
        if not math.isfinite(self.relative):
            return math.inf if math.isfinite(self.before) else 0.0
        return max(self.relative - self.before, 0.0)

    def __str__(self):
        where = ", preprocessing" if self.preprocessing else ""
        if not math.isfinite(self.relative):
            return f"{self.layer}{where}: its output holds NaN or Inf"
        return (f"{self.layer}{where}: its output's worst channel is off by an rms "
                f"{self.error:.3g}, {self.relative:.0%} of that channel's spread "
                f"({self.spread:.3g}); before it, at most {self.before:.0%}")


def localise_drift(drift, layer_order, preprocessing_names):
    """[LayerDrift] from `litert.activation_drift`: the layers that add to it, in the order they run.

    `layer_order`: the layers' names in the order they run. A layer's
    output is the worst of the tensors named after it; what it adds is how
    far that exceeds every earlier layer's (a layer downstream of a broken
    one inherits its error and adds nothing). Layers that add nothing are
    left out.
    """
    known = set(layer_order)
    by_layer = {}
    for row in drift:
        layer = layer_of(row["tensor"], known)
        if layer in known and (layer not in by_layer
                               or _worse(row["relative"], by_layer[layer]["relative"])):
            by_layer[layer] = row
    found, before = [], 0.0
    for layer in layer_order:
        row = by_layer.get(layer)
        if row is None:
            continue
        entry = LayerDrift(layer=layer, tensor=row["tensor"], relative=row["relative"],
                           error=row["error"], spread=row["spread"], before=before,
                           preprocessing=layer in preprocessing_names)
        if entry.added > 0:
            found.append(entry)
        if _worse(row["relative"], before):
            before = row["relative"]
    if not found:
        return []
    # Rounding everywhere adds a little at every layer: name the ones that
    # add at least a tenth of what the worst adds, in the order they run
    # (the first is where the departure starts).
    worst = max(entry.added for entry in found)
    return [entry for entry in found if entry.added >= worst / 10]


def _worse(a, b):
    return (not math.isfinite(a) and math.isfinite(b)) or a > b


def repair(calibration, layers, judge_candidate, tries=REPAIR_TRIES):
    """An int8 model that passes with the fewest layers in float that this search finds.

    The worst 1, 2, ... layers are kept in float until a model passes; then
    each of them is put back into int8, least damaging first, where the model
    still passes without it (an op ranked high only because its int8 inputs
    come from another one recovers once that one is float).

    Args:
        calibration: the `Int8Calibration` that measured `layers`.
        layers: `localise`'s LayerErrors, worst first.
        judge_candidate: flatbuffer -> `judgement.Verdict`, on the
            verification's inputs.

    Returns:
        (flatbuffer, the LayerErrors kept in float, its Verdict), or
        (None, the LayerErrors of the last try, its Verdict) when none passed.
    """
    def attempt(kept):
        flatbuffer = calibration.model_keeping_float([layer.tensor for layer in kept])
        return flatbuffer, judge_candidate(flatbuffer)

    verdict, kept, found = None, [], None
    for count in range(1, min(len(layers), tries) + 1):
        kept = layers[:count]
        flatbuffer, verdict = attempt(kept)
        if verdict.passed:
            found = (flatbuffer, kept, verdict)
            break
    if found is None:
        return None, kept, verdict
    for layer in reversed(found[1][:-1]):   # the last one added was needed: without it, no pass
        fewer = [other for other in found[1] if other is not layer]
        flatbuffer, verdict = attempt(fewer)
        if verdict.passed:
            found = (flatbuffer, fewer, verdict)
    return found


def table(layers, count=5):
    """The worst `count` layers, one a line, for an error message."""
    return "\n".join(f"  - {layer}" for layer in layers[:count])


def preprocessing_note(kept):
    """Where in-graph preprocessing is what int8 cannot hold: the other option and its cost."""
    names = sorted({layer.layer for layer in kept if layer.preprocessing})
    if not names:
        return ""
    return (f"The preprocessing ({', '.join(names)}) is what int8 cannot hold here. The other "
            "option is to move it out of the quantised graph: export the model without "
            "`preprocessing=` and apply it before calling the artefact. The artefact is then "
            "int8 throughout (smaller, integer-only accelerators can run it whole), but every "
            "caller must apply the same preprocessing, which the artefact no longer guarantees "
            "(serving can then drift from training).")


def refusal(quantize, verdict, layers, strict, kept=None, last=None):
    """The ExportError message for an int8 model that failed, with the layers to blame.

    `verdict` is the fully quantised model's; `kept` and `last`, the layers
    kept in float on the last repair tried and its verdict.
    """
    head = (f"The {quantize} LiteRT model is too far from the model: {verdict.problem}. "
            "Nothing was left at the path.")
    if layers and quantize != "int8":
        closer = ", or \"float16\" (closer to float)" if quantize == "dynamic" else ""
        return (head + "\nWhere it departs from the float32 model (each layer's output "
                "against the float32 model's, on the verification inputs, in the order the "
                f"layers run):\n{table(layers)}"
                f"\nFix: quantize=None (float32){closer}; or quantize=\"int8\" with "
                "representative_data, which keeps the layers that lose the accuracy in "
                f"float32; or look at the first of those layers: {CAUSES[quantize]}")
    if not layers:
        if quantize != "int8":
            closer = ", or \"float16\" (closer to float)" if quantize == "dynamic" else ""
            return head + (" The layers to blame are found on int8's calibration (TensorFlow's "
                           "QuantizationDebugger), which this quantisation has none of. Fix: "
                           f"quantize=None (float32){closer}; or quantize=\"int8\" with "
                           "representative_data, which names the layers that lose the "
                           "accuracy and keeps them in float32.")
        return head + (" Fix: a lighter quantisation (\"float16\", \"dynamic\"), or "
                       "representative_data that covers the inputs' real range.")
    blame = ("\nThe layers that lose the most in int8 (error each adds, against its output's "
             f"spread):\n{table(layers)}")
    note = preprocessing_note(layers[:3])
    if strict:
        return (head + blame + "\nstrict=True refuses instead of keeping them in float. Fix: "
                "strict=False (the worst layers stay in float32, the rest in int8)"
                + (", or move the preprocessing out" if note else "") + "; or a lighter "
                "quantisation (\"float16\", \"dynamic\")." + (f"\n{note}" if note else ""))
    tried = ", ".join(layer.layer for layer in kept or [])
    last_problem = last.problem if last is not None else "not tried"
    return (head + blame + f"\nKeeping up to {len(kept or [])} of them in float32 ({tried}) "
            f"did not pass either (last try: {last_problem}). Fix: a lighter quantisation "
            "(\"float16\", \"dynamic\"), or representative_data that covers the inputs' real "
            "range." + (f"\n{note}" if note else ""))
