"""tf.data pipelines, followed through a scope for TW109 (slow or unshuffled input pipelines).

A pipeline is the list of its ops, `[(op name, call node)]`, from a root
(`tf.data.Dataset.from_tensor_slices(...)`) or from a name the scope assigned a
pipeline to, so that `ds = ds.batch(32)` on a later line extends it. Findings
go through `report(node, code, **fields)`, the checker's.
"""

import ast
import re

from tapeworks.lint.syntax import call_name, has_keyword

DATASET_OPS = {"map", "batch", "padded_batch", "ragged_batch", "shuffle", "prefetch", "cache",
               "repeat", "unbatch", "filter", "take", "skip", "interleave", "flat_map",
               "apply", "with_options", "rebatch", "shard", "enumerate", "window",
               "snapshot", "concatenate", "map_with_legacy_function", "parallel_interleave"}
DATASET_ROOT = re.compile(r"(^|\.)data\.(Dataset|TFRecordDataset|TextLineDataset|"
                          r"FixedLengthRecordDataset|experimental)|(^|\.)Dataset\.\w+$|"
                          r"^(TFRecordDataset|TextLineDataset)$")


# What keeps a map sequential: tf.data parallelises a `.map(fn)` without
# num_parallel_calls by itself (its default `map_parallelization` rewrite)
# unless `fn` is stateful. These are the stateful calls a file can show: TF's
# random ops with hidden state (not the `stateless_` ones) and Python calls.
STATEFUL_IN_MAP = re.compile(
    r"^(tf|tensorflow)\.(compat\.v1\.)?(random\.(uniform|normal|truncated_normal|shuffle|"
    r"categorical|gamma|poisson|poisson_v2|crop)|image\.random_\w+|py_function|"
    r"numpy_function|py_func)$")


def stateful_call(body, callee):
    """The dotted name of the first stateful TF call (`STATEFUL_IN_MAP`) in `body`, or None.

    `callee(call)`: the FunctionDef of this file a call calls, or None;
    followed one level down.
    """
    for node in (n for part in body for n in ast.walk(part)):
        if not isinstance(node, ast.Call):
            continue
        name = call_name(node) or ""
        if STATEFUL_IN_MAP.match(name):
            return name
        inner = callee(node)
        if inner is not None:
            found = stateful_call(inner.body, lambda call: None)
            if found:
                return f"{found} (in `{inner.name}`)"
    return None


def dataset_ops(node, datasets, report, stateful_map=lambda call: None):
    """[(op, call)] of a tf.data pipeline expression, checking map/shuffle on the way.

    `datasets`: {name: ops} of the pipelines the scope assigned. None when `node`
    is not a pipeline. `stateful_map(call)`: the stateful call a `.map` call's
    function shows (`stateful_call`), or None.
    """
    chain = []
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr in DATASET_OPS:
        chain.append((node.func.attr, node))
        node = node.func.value
    chain.reverse()
    if isinstance(node, ast.Name) and node.id in datasets:
        prefix = datasets[node.id]
    elif isinstance(node, ast.Call) and DATASET_ROOT.search(call_name(node) or ""):
        prefix = []
    else:
        return None
    if not chain and not prefix and not isinstance(node, ast.Call):
        return None
    ops = prefix + chain
    for index, (op, call) in enumerate(ops[len(prefix):], len(prefix)):
        stateful = op == "map" and not has_keyword(call, "num_parallel_calls") and \
            len(call.args) < 2 and stateful_map(call)
        if stateful:
            report(call, "TW109", what=f".map() without num_parallel_calls runs one element at "
                                       f"a time: `{stateful}` in its function is stateful, so "
                                       "tf.data does not parallelise it itself")
        if op == "shuffle":
            before = [o for o, _ in ops[:index]]
            last_batch = max((i for i, o in enumerate(before)
                              if o in ("batch", "padded_batch")), default=None)
            if last_batch is not None and "unbatch" not in before[last_batch:]:
                report(call, "TW109", what=".shuffle() after .batch() shuffles "
                                           "whole batches, not samples")
    return ops
