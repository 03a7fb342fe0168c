"""What tf.data changes in a pipeline by itself, before it runs: its default graph rewrites.

When an iterator is made, tf.data rewrites the pipeline's graph. Two of its
default rewrites (TensorFlow >= 2.9; on unless the dataset's options turn them
or autotuning off) make two classic pipeline mistakes harmless:

- `map_parallelization` turns a `.map(fn)` without `num_parallel_calls`
  into `.map(fn, num_parallel_calls=AUTOTUNE, deterministic=True)`, when
  `fn` is stateless (no random op with hidden state, no variable, no
  py_function; an Assert does not count);
- `inject_prefetch` ends a pipeline whose last step is not a prefetch with
  `.prefetch(AUTOTUNE)`.

So a data check that reported those without asking would be wrong for most
pipelines (measured: a stateless map without `num_parallel_calls` ran as fast
as with AUTOTUNE, 0.34 s against 0.31 s, and 0.60 s with the rewrite off; 2
cores, AMD EPYC). This module answers the two questions from the graph the
check reads (`pipeline_check.dataset_graph`), mirroring TensorFlow's
`DefaultOptimizationGraphRewrites` (tensorflow/core/data/dataset_utils.cc)
and `function_utils::IsFunctionStateful` (grappler's data optimizers):
there is no public API that says which rewrites ran.
"""

from __future__ import annotations

import dataclasses

from tensorflow.core.framework import dataset_options_pb2
from tensorflow.python.framework import op_def_registry


@dataclasses.dataclass(frozen=True)
class DefaultRewrites:
    """Which of tf.data's own rewrites run on a pipeline, from its options."""

    maps_parallelised: bool   # stateless sequential maps run in parallel
    prefetch_injected: bool   # a prefetch(AUTOTUNE) is added at the end
    maps_off: str = ""        # the option that keeps maps sequential, for a finding's message
    prefetch_off: str = ""    # the option that stops the final prefetch

    @classmethod
    def of(cls, nodes, sink_first):
        """From the pipeline's OptionsDataset nodes, merged as `Dataset.options()` merges them.

        Args:
            nodes: {name: NodeDef} of the dataset graph.
            sink_first: the main path's dataset nodes from the final one back
                to the source. Options on it are merged last, nearer the end
                winning a conflict; options of other inputs (a zip's second
                dataset) before them.
        """
        on_path = [n for n in reversed(sink_first) if n.op == "OptionsDataset"]
        others = [n for n in nodes.values()
                  if n.op == "OptionsDataset" and not any(n is m for m in on_path)]
        merged = dataset_options_pb2.Options()
        for node in others + on_path:
            merged.MergeFromString(node.attr["serialized_options"].s)
        optimization = merged.optimization_options
        if _setting(merged.autotune_options, "enabled") is False:
            # TensorFlow's rule: nothing of this runs with autotuning off.
            off = "options.autotune.enabled=False turns tf.data's own rewrites off"
            return cls(False, False, off, off)
        defaults = _setting(optimization, "apply_default_optimizations") is not False

        def why_not(field):
            # An explicit setting wins; unset follows the defaults.
            explicit = _setting(optimization, field)
            if explicit is True or (explicit is None and defaults):
                return ""
            if explicit is False:
                return f"options.experimental_optimization.{field}=False"
            return ("options.experimental_optimization.apply_default_optimizations=False "
                    "turns tf.data's own rewrites off")

        maps_off, prefetch_off = why_not("map_parallelization"), why_not("inject_prefetch")
        return cls(not maps_off, not prefetch_off, maps_off, prefetch_off)


def _setting(message, field):
    """A proto's optional field: its value when set, else None (TensorFlow's default)."""
    return getattr(message, field) if message.HasField(field) else None


def keeps_map_sequential(node, functions):
    """Why tf.data leaves a `MapDataset` sequential whatever its options, or None.

    `node`: the MapDataset's NodeDef; `functions`: {name: FunctionDef} of the
    graph's library. The reason names the op, e.g. "its function runs the
    stateful op RandomUniform".
    """
    if node.attr["force_synchronous"].b:
        return "it was made with force_synchronous"
    op = _stateful_op(node.attr["f"].func.name, functions, {})
    return f"its function runs the stateful op {op}" if op else None


def _stateful_op(name, functions, known):
    """The first op that makes function `name` stateful to tf.data, or None.

    TensorFlow's `IsFunctionStateful(..., skip_assert=true)`: a function not
    marked stateful is not; else any node whose op is stateful, except an
    Assert, an If or While whose branches are both stateless; an op the
    registry does not know (a call of a function by name) counts as stateful.
    `known`: {function name: answer}, shared by the recursion.
    """
    if name in known:
        return known[name]
    function = functions.get(name)
    if function is None:
        return name or "an unknown function"
    known[name] = None   # a function that calls itself adds nothing
    if function.signature.is_stateful:
        known[name] = next(filter(None, (_stateful_node(inner, functions, known)
                                         for inner in function.node_def)), None)
    return known[name]


def _stateful_node(inner, functions, known):
    op_def = op_def_registry.get(inner.op)
    if op_def is None:
        return inner.op
    if not op_def.is_stateful or inner.op == "Assert":
        return None
    if inner.op in ("If", "While"):
        branches = ("then_branch", "else_branch") if inner.op == "If" else ("cond", "body")
        return next(filter(None, (_stateful_op(inner.attr[b].func.name, functions, known)
                                  for b in branches)), None)
    return inner.op
