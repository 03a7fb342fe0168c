"""tf.data pipelines, followed through a scope for TW109 (slow input pipelines).

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


def dataset_ops(node, datasets, report):
    """[(op, call)] of a tf.data pipeline expression, checking map/shuffle on the way.

    `datasets`: {name: ops} of the pipelines the scope assigned. None when `node`
    is not a pipeline.
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
        if op == "map" and not has_keyword(call, "num_parallel_calls") and \
                len(call.args) < 2:
            report(call, "TW109", what=".map() without num_parallel_calls runs "
                                       "one element at a time")
        if op == "shuffle":
            before = [o for o, _ in ops[:index]]
            last_batch = max((i for i, o in enumerate(before)
                              if o in ("batch", "padded_batch")), default=None)
            if last_batch is not None and "unbatch" not in before[last_batch:]:
                report(call, "TW109", what=".shuffle() after .batch() shuffles "
                                           "whole batches, not samples")
    return ops


def check_consumed(expr, datasets, report):
    """A pipeline handed to training or iterated (`expr`) should end with prefetch."""
    if isinstance(expr, ast.Name):
        ops = datasets.get(expr.id)
        if ops is not None:
            check_prefetch(ops, expr.id, report)
    elif isinstance(expr, ast.Call):
        ops = dataset_ops(expr, datasets, report)
        if ops is not None:
            check_prefetch(ops, None, report)


def check_prefetch(ops, name, report):
    """TW109 when a batched pipeline has no prefetch after its last batch."""
    names = [op for op, _ in ops]
    batches = [i for i, op in enumerate(names) if op in ("batch", "padded_batch")]
    if not batches or "prefetch" in names[batches[-1]:]:
        return
    subject = f"the batched tf.data pipeline `{name}`" if name else \
        "this batched tf.data pipeline"
    report(ops[-1][1], "TW109", what=f"{subject} does not end with .prefetch(): the "
                                     "step waits for every batch")
