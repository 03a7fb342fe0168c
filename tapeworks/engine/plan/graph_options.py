"""How TensorFlow optimises tapeworks' own functions when it first runs them, on a CPU.

A `tf.function`'s first call instantiates its graph: grappler's meta
optimiser rewrites it, in two rounds of every pass by default. On a CPU
most of that time is spent where it changes nothing: the second round (on
the small CNN of benchmarks/examples.md it removed 2 of 619 nodes), the
layout pass (it converts between NHWC and NCHW for GPUs), the memory
optimiser (swapping to host memory, for accelerators) and the MLIR (tfg)
passes (0 nodes changed on tapeworks' loops). Measured from grappler's own
log (`TF_CPP_VMODULE=meta_optimizer=1`) on a 3-conv CNN's train loop: 285 ms
of grappler at its first call by default, 79 ms with those four left out;
the passes that do change a CPU graph (pruning, common subexpressions,
constant folding, arithmetic, the remapper's fused kernels, dependencies)
still run, once. Keras' own train function paid 120 ms; tapeworks' loop,
with its `while` and the checks, is a larger graph, and its first call was
the largest part of the start-up it paid over Keras' `fit` (issue 35).

The options travel with each call (TensorFlow's per-call `config_proto`,
read once, when the function is instantiated), so they apply to tapeworks'
compiled functions alone, not to the user's own `tf.function`s called
elsewhere, and only when no GPU or TPU is visible. A pass the user turned
off stays off; only passes left at their default are changed.
"""

import contextlib
import functools

import tensorflow as tf
# TensorFlow's per-call function options: the same object `tf.function` reads
# when it calls a graph (`atomic_function`, `context.call_function`). No public
# API sets grappler's options for one function's calls only.
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
from tensorflow.python.eager import context

_Rewriter = rewriter_config_pb2.RewriterConfig


@functools.lru_cache(maxsize=None)
def on_cpu_only():
    """Whether every device TensorFlow shows is a CPU (asked once: devices are fixed at start)."""
    return not (tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


@functools.lru_cache(maxsize=8)
def lean_options(serialized):
    """`serialized` (a ConfigProto) with the CPU-idle passes left out, as call options."""
    config = config_pb2.ConfigProto()
    config.ParseFromString(serialized)
    rewrite = config.graph_options.rewrite_options
    if rewrite.meta_optimizer_iterations == _Rewriter.DEFAULT_NUM_ITERS:
        rewrite.meta_optimizer_iterations = _Rewriter.ONE
    if rewrite.layout_optimizer == _Rewriter.DEFAULT:
        rewrite.layout_optimizer = _Rewriter.OFF
    if rewrite.memory_optimization == _Rewriter.DEFAULT_MEM_OPT:
        rewrite.memory_optimization = _Rewriter.NO_MEM_OPT
    rewrite.disable_tfg_optimizer = True
    return context.FunctionCallOptions(config_proto=config)


@contextlib.contextmanager
def lean_instantiation():
    """Inside: this thread's function calls are instantiated with the lean options (see above)."""
    if not on_cpu_only():
        yield
        return
    ctx = context.context()
    before = ctx.function_call_options
    ctx.function_call_options = lean_options(before.config_proto_serialized)
    try:
        yield
    finally:
        ctx.function_call_options = before


class LeanCalls:
    """A `tf.function` whose calls run inside `lean_instantiation()`; otherwise the function itself."""

    def __init__(self, function):
        self._function = function

    def __call__(self, *args, **kwargs):
        with lean_instantiation():
            return self._function(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._function, name)


def lean_calls(function):
    """`LeanCalls(function)` for a `tf.function`; anything else (an eager step) as it is."""
    if isinstance(function, tf.types.experimental.PolymorphicFunction):
        return LeanCalls(function)
    return function
