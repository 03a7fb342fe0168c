"""Parse alone: a 1M-value predict body through rest.parse_body and rest.predict_inputs.

python benchmarks/serve-orjson/parse_alone.py  (medians of 5, one process; json.loads beside)

The heap is frozen first (`gc.freeze()`), as `tapeworks serve` freezes it once
its models are loaded: otherwise each full collection the parse's lists set
off walks TensorFlow's few hundred thousand objects.
"""
import gc
import json
import time

import numpy as np
import tensorflow as tf

from tapeworks.serve import rest
from tapeworks.serve.servable import InputSpec

rows = np.random.default_rng(0).standard_normal((250_000, 4)).astype(np.float32)
body = json.dumps({"instances": rows.tolist()}).encode()
specs = {"x": InputSpec("x", tf.float32, (None, 4), "x:0")}


def median_seconds(work, repeats=5):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


gc.collect()
gc.freeze()
print(f"body {len(body) / 1e6:.1f} MB, 1,000,000 float32 values")
print(f"json.loads alone      {median_seconds(lambda: json.loads(body)):.3f} s")
print(f"rest.parse_body       {median_seconds(lambda: rest.parse_body(body)):.3f} s")
document = rest.parse_body(body)[0]   # after: a live document makes collections longer
print(f"rest.predict_inputs   {median_seconds(lambda: rest.predict_inputs(document, specs)):.3f} s")
