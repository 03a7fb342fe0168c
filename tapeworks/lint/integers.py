"""Which expressions are integer tensors, for TW110 (integer division meant as a ratio).

A name is an integer tensor when the scope assigned it one (the checker keeps
the set per scope); a call is one when its dtype says so, or when the op always
returns integers (`tf.size`, `tf.argmax`), or when it reduces an integer tensor.
"""

import ast
import re

from tapeworks.lint.syntax import call_name, dotted

INT_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
INT_RESULT_FUNCS = {"size", "shape", "rank", "argmax", "argmin", "count_nonzero"}
REDUCTIONS = {"reduce_sum", "reduce_prod", "reduce_max", "reduce_min", "abs", "add",
              "subtract", "multiply", "maximum", "minimum", "square"}
RATIO_NAME = re.compile(r"acc|ratio|rate|frac|percent|share|mean|avg|precision|recall",
                        re.IGNORECASE)


def is_int_tensor(node, int_names):
    """True when `node` is an integer tensor; `int_names`: the scope's names known to be."""
    if isinstance(node, ast.Name):
        return node.id in int_names
    if isinstance(node, ast.Subscript):
        return is_int_tensor(node.value, int_names)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        return is_int_tensor(node.left, int_names) and is_int_tensor(node.right, int_names)
    if not isinstance(node, ast.Call):
        return False
    name = call_name(node) or ""
    base, _, last = name.rpartition(".")
    if not base.split(".")[0] in ("tf", "tensorflow"):
        return False
    dtype = next((k.value for k in node.keywords if k.arg in ("dtype", "out_type",
                                                              "output_type")), None)
    if last == "cast" and len(node.args) >= 2:
        dtype = node.args[1]
    if dtype is not None:
        return dtype_name(dtype) in INT_DTYPES
    if last in INT_RESULT_FUNCS or literal_int(node) is not None:
        return True
    if last in REDUCTIONS and node.args:
        return is_int_tensor(node.args[0], int_names)
    return False


def is_count(node, count_names, int_names):
    """A count of successes: a name the scope assigned one, or an integer reduce_sum."""
    if isinstance(node, ast.Name):
        return node.id in count_names
    if isinstance(node, ast.Call):
        last = (call_name(node) or "").split(".")[-1]
        return last in ("reduce_sum", "count_nonzero") and is_int_tensor(node, int_names)
    return False


def literal_int(node):
    """7 for `tf.constant(7)` (no dtype, an int literal), else None."""
    if not (isinstance(node, ast.Call) and (call_name(node) or "").split(".")[-1] == "constant"
            and (call_name(node) or "").split(".")[0] in ("tf", "tensorflow")
            and node.args and not node.keywords):
        return None
    value = node.args[0]
    if isinstance(value, ast.Constant) and type(value.value) is int:
        return value.value
    return None


def always_zero(division):
    """`tf.constant(7) // tf.constant(10)`: constants whose floor division is always 0."""
    left, right = literal_int(division.left), literal_int(division.right)
    return left is not None and right is not None and 0 <= left < right


def dtype_name(node):
    """"int32" for `"int32"`, `tf.int32` or `tensorflow.dtypes.int32`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    name = dotted(node)
    return name.split(".")[-1] if name else None
