"""Is training waiting for data? Pipeline, compute and training throughput, measured.

`Trainer.diagnose_input(dataset)` (or `Trainer(..., diagnose_input=True)`,
which reports after the first epoch) measures, on the same number of batches:

* the pipeline alone: batches per second that the dataset can produce;
* compute alone: the training step on the same batches held in memory;
* training: the step fed by the pipeline, as in `fit`.

The share of step time spent waiting for data is 1 - training / compute. The
trainer's state (weights, optimizer, counters) is saved before the compute
and training runs and restored after, so measuring trains nothing.
"""

import dataclasses

from tapeworks.data.pipeline_check import check
from tapeworks.docs_links import see_docs


@dataclasses.dataclass
class InputReport:
    pipeline_batches_per_s: float
    compute_batches_per_s: float
    training_batches_per_s: float
    findings: list

    @property
    def wait_share(self):
        """The share of training time spent waiting for the next batch."""
        return max(0.0, 1.0 - self.training_batches_per_s / self.compute_batches_per_s)

    @property
    def input_bound(self):
        return self.pipeline_batches_per_s < 0.95 * self.compute_batches_per_s

    def advice(self):
        if not self.input_bound:
            return [f"compute-bound: the pipeline makes {self.pipeline_batches_per_s:,.1f} "
                    f"batches/s and the step uses {self.compute_batches_per_s:,.1f}; "
                    "speed up the step (precision=\"auto\", XLA) rather than the input"]
        advice = [f"{f.code}: {f.fix} ({see_docs(f.code)})" for f in self.findings]
        advice += ["move deterministic decoding before a `.cache()` so it runs once",
                   "use `num_parallel_calls=tf.data.AUTOTUNE` on every map (tapeworks.data."
                   "pipeline does) and prefer TensorFlow ops to py_function",
                   "use batch-level augmentation (`batch_augment=`) when per-example "
                   "augmentation is the bottleneck"]
        return advice

    def __str__(self):
        kind = "INPUT-BOUND" if self.input_bound else "compute-bound"
        lines = [f"Input diagnosis: {kind}. Pipeline alone {self.pipeline_batches_per_s:,.1f} "
                 f"batches/s; step alone {self.compute_batches_per_s:,.1f}; training "
                 f"{self.training_batches_per_s:,.1f}: {100 * self.wait_share:.0f}% of step "
                 "time waits for data."]
        lines += [f"  - {item}" for item in self.advice()]
        return "\n".join(lines)


def pipeline_rate(dataset, batches):
    """Batches per second the dataset produces, after its first batch."""
    import time

    iterator = iter(dataset)
    next(iterator)
    start = time.perf_counter()
    produced = 0
    for _ in range(batches):
        try:
            next(iterator)
        except StopIteration:
            break
        produced += 1
    return produced / max(time.perf_counter() - start, 1e-9)


def report(dataset, pipeline, compute, training):
    return InputReport(pipeline, compute, training, check(dataset, training=True))
