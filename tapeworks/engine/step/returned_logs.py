"""Logs a model's own code returns (its `train_step`, `test_step` or `compute_metrics`),
reported as Keras' `fit` and `evaluate` report them.

Keras' rule (`Trainer._get_metrics_result_or_logs`): when the returned logs have
exactly the keys of the model's metrics' results, the metrics are read
(`get_metrics_result`); otherwise the logs the last step returned are
reported, whatever they hold (a batch's statistics, a renamed metric).
"""

import keras
import tensorflow as tf

from tapeworks.errors import ConfigError


class OwnLogs:
    """The logs of the model's own steps, as `model.fit` and `model.evaluate` report them.

    Keras' rule (`Trainer._get_metrics_result_or_logs`): when a step's logs
    have exactly the keys of the model's metrics' results, the metrics are
    read (`get_metrics_result`); otherwise the logs the last step returned are
    reported. Here the first case reads the metrics once per call, at the end
    of the loop; the second keeps each step's logs in variables (created
    outside any graph at the first trace, one per key and kind), read there.
    """

    def __init__(self, model):
        self.model = model
        self.reads_metrics = {}   # kind -> True (metrics' results) or False (kept logs)
        self.kept = {}            # kind -> {key: tf.Variable}

    def metric_results(self, skip=None):
        """`model.get_metrics_result()` as tensors (usable in a graph), less the metric `skip`."""
        results = {}
        for metric in self.model.metrics:
            if metric is skip:
                continue
            result = metric.result()
            if isinstance(result, dict):
                results.update(result)
            else:
                results[metric.name] = result
        return results

    def keep(self, kind, logs):
        """In the step: decides the rule for `kind` ("train", "test"), keeps `logs` if needed."""
        if not isinstance(logs, dict):
            raise ConfigError(
                f"The model's `{kind}_step` returned {type(logs).__name__}. Expected a dict of "
                "logs, as Keras' fit expects, e.g. `return {\"loss\": loss}` or "
                "`{m.name: m.result() for m in self.metrics}`.")
        reads = set(logs) == set(self.metric_results())
        self.reads_metrics[kind] = reads
        if reads:
            return
        kept = self.kept.setdefault(kind, {})
        context = tf.distribute.get_replica_context()
        for key, value in flattened(logs).items():
            value = tf.convert_to_tensor(value)
            if (context is not None and context.num_replicas_in_sync > 1
                    and value.dtype.is_floating):
                # Keras reports a step's logs as their mean over the replicas
                # (`reduce_per_replica(..., "auto")` off TPUs).
                value = context.all_reduce(tf.distribute.ReduceOp.MEAN, value)
            if key not in kept:
                with tf.init_scope():
                    # Created eagerly even while the step traces: the loop
                    # that reads it is the same graph on every call.
                    # A log whose shape varies (per batch) gets a variable of any shape.
                    known = value.shape.is_fully_defined()
                    kept[key] = tf.Variable(tf.zeros(value.shape if known else [], value.dtype),
                                            shape=value.shape if known else tf.TensorShape(None),
                                            trainable=False, name=f"{kind}_logs_{len(kept)}")
            kept[key].assign(value)

    def results(self, kind):
        """The logs of `kind` by Keras' rule (tensors); empty before its step first traced."""
        if kind not in self.reads_metrics:
            return {}
        if self.reads_metrics[kind]:
            return self.metric_results()
        return {key: variable.read_value() for key, variable in self.kept[kind].items()}


def flattened(logs):
    """Nested dicts of logs merged into one, as Keras' `pythonify_logs` merges them.

    Keras' documented custom step returns `{m.name: m.result() for m in
    self.metrics}`, where the compiled metrics' result is itself a dict.
    """
    result = {}
    for key, value in sorted(logs.items()):
        if isinstance(value, dict):
            result.update(flattened(value))
        else:
            result[key] = value
    return result


class CompiledLogs:
    """The metrics and logs of a compiled Keras model trained by tapeworks' own step.

    Keras' `train_step` and `test_step` return `model.compute_metrics(...)`,
    reported by Keras' rule (`OwnLogs`). Its own `compute_metrics` returns
    every metric's result (the rule reads the metrics); an override may
    return other keys, whose last values are then the logs, "loss" only if
    it returns one. The loss is tracked by the training state (in the
    model's own loss tracker, `SupervisedTask.loss_tracker`) and logged from
    there, so the metrics' results here leave that tracker out.
    """

    def __init__(self, model):
        self.model = model
        self.returned = OwnLogs(model)
        self.kind = None   # "train" or "test": the kind of the step traced last

    def update(self, outputs, kind):
        """In the step: the model's metrics updated from `outputs` (x, y, y_pred, sample_weight)."""
        model = self.model
        if type(model).compute_metrics is keras.Model.compute_metrics:
            # What Keras' own `compute_metrics` updates, without what it then
            # returns: every metric's result, read in each step and thrown
            # away (the call reads the results once, at its end). Those were
            # a graph's worth of nodes in every step (12 divisions and their
            # reads for a model with 11 metrics), paid in tracing and first call.
            compiled = getattr(model, "_compile_metrics", None)
            if compiled is not None:
                compiled.update_state(outputs["y"], outputs["y_pred"], outputs["sample_weight"])
            return
        # The model's own override, called as Keras' step calls it; what it
        # returns is kept where Keras would report it. The loop reads the logs
        # right after tracing its steps, so the kind traced last is the one read.
        returned = model.compute_metrics(outputs["x"], outputs["y"], outputs["y_pred"],
                                         sample_weight=outputs["sample_weight"])
        self.kind = kind
        if isinstance(returned, dict):
            self.returned.keep(kind, returned)

    def _returned_logs(self):
        return self.returned.reads_metrics.get(self.kind) is False

    def results(self):
        """The logs' metric values; a metric of the model's own named "loss" replaces tapeworks'.

        Keras' `get_metrics_result`, less the model's loss tracker (later
        names win, so a tracker named "loss" that a `compute_loss` override
        updates, as in Keras' masked-language-model example, is "loss").
        """
        if self._returned_logs():
            return self.returned.results(self.kind)
        return self.returned.metric_results(skip=getattr(self.model, "_loss_tracker", None))

    def hidden_losses(self):
        """{"loss"} where Keras' logs have no loss of tapeworks' kind, else empty.

        Returned logs of other keys replace all; a model whose own `metrics`
        property leaves out its loss tracker logs no "loss" in Keras.
        """
        tracker = getattr(self.model, "_loss_tracker", None)
        listed = tracker is None or any(m is tracker for m in self.model.metrics)
        return frozenset({"loss"}) if self._returned_logs() or not listed else frozenset()
