"""Where a corpus script's `fit` spends its time: every trace and every slow graph call, in order.

    TAPEWORKS_CORPUS_FIT=tapeworks TAPEWORKS_CACHE_DIR=$(mktemp -d) \
        python benchmarks/examples-second-run/timeline.py examples/corpus/tf_images_cnn.py

(`TAPEWORKS_CORPUS_FIT=keras` for Keras' own fit; a fresh cache folder for a
cold run.) Prints, to stderr, seconds from the start of `fit`: each
`tf.function` trace (nested ones indented, with the tapeworks frames that
asked for it), each graph call over 20 ms, and for each function's first
such call the nodes of its graph and of the functions it calls (graph size is
what a first trace and a first call pay for). Wraps TensorFlow's own
`tracing_compilation._create_concrete_function` and
`AtomicFunction.call_preflattened` (TensorFlow 2.20/2.21 internals: a
measuring aid, not a tapeworks API).
"""

import os
import runpy
import sys
import time
import traceback

script = sys.argv[1]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
sys.argv = [script]
import corpus_fit  # noqa: E402  (first: picks whose fit trains)
from tensorflow.python.eager.polymorphic_function import atomic_function  # noqa: E402
from tensorflow.python.eager.polymorphic_function import tracing_compilation  # noqa: E402

started = [None]
events = []
depth = [0]
create = tracing_compilation._create_concrete_function
call_preflattened = atomic_function.AtomicFunction.call_preflattened


def timed_create(function_type, type_context, func_graph, tracing_options):
    start = time.perf_counter()
    depth[0] += 1
    try:
        return create(function_type, type_context, func_graph, tracing_options)
    finally:
        depth[0] -= 1
        if started[0] is not None:
            frames = [f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}"
                      for f in traceback.extract_stack() if "/tapeworks/" in f.filename][-3:]
            events.append((start - started[0], time.perf_counter() - start,
                           f"trace {'  ' * depth[0]}{tracing_options.name}  "
                           + " < ".join(reversed(frames))))


def timed_call(self, args):
    start = time.perf_counter()
    try:
        return call_preflattened(self, args)
    finally:
        seconds = time.perf_counter() - start
        if started[0] is not None and seconds > 0.02:
            name = self.name.decode() if isinstance(self.name, bytes) else str(self.name)
            if not getattr(self, "_timeline_counted", False):
                self._timeline_counted = True
                library = self.graph.as_graph_def().library.function
                nodes = len(self.definition.node_def) + sum(len(f.node_def) for f in library)
                events.append((start - started[0], 0.0,
                               f"graph {name}: {nodes} nodes in {1 + len(library)} functions"))
            events.append((start - started[0], seconds, f"call  {name}"))


tracing_compilation._create_concrete_function = timed_create
atomic_function.AtomicFunction.call_preflattened = timed_call
fit = corpus_fit.fit


def timed_fit(*args, **kwargs):
    started[0] = time.perf_counter()
    try:
        return fit(*args, **kwargs)
    finally:
        total = time.perf_counter() - started[0]
        started[0] = None
        for at, seconds, what in sorted(events):
            print(f"{at:7.3f} {seconds:6.3f}  {what}", file=sys.stderr)
        print(f"fit total {total:.3f} s", file=sys.stderr)


corpus_fit.fit = timed_fit
runpy.run_path(script, run_name="__main__")
