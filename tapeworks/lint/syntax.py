"""Reading Python's `ast` the way the rules need it: a faster walk, dotted names, and
the few shapes of call the rules look for (a tape, a tf.function, a keyword).

Pure functions of nodes, with no rule in them: the rules' modules share them.
"""

import ast

# Nodes with nothing inside that any rule looks at: contexts, operators, constants.
LEAVES = (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop, ast.Constant)


def children(node):
    """The child nodes of `node`: `ast.iter_child_nodes`, without its per-field generator."""
    for field in node._fields:
        value = getattr(node, field, None)
        if isinstance(value, list):
            for item in value:
                if isinstance(item, ast.AST) and not isinstance(item, LEAVES):
                    yield item
        elif isinstance(value, ast.AST) and not isinstance(value, LEAVES):
            yield value


def walk(tree):
    """Every node below `tree` (order irrelevant), skipping leaves: a faster `ast.walk`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(children(node))


def dotted(node):
    """"tf.keras.layers.Dense" for the expression `tf.keras.layers.Dense`, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def call_name(call):
    """The dotted name a call calls (`tf.data.Dataset.range`), else None."""
    return dotted(call.func) if isinstance(call, ast.Call) else None


def has_keyword(call, name):
    """True when `call` passes `name=`, or `**kwargs` that may hold it."""
    return any(k.arg == name or k.arg is None for k in call.keywords)


def is_tape_call(node):
    """`tf.GradientTape(...)` or `GradientTape(...)`."""
    name = call_name(node)
    return bool(name) and (name == "GradientTape" or name.endswith(".GradientTape"))


def is_persistent(call):
    """A tape call with `persistent=` anything but a literal False."""
    return any(k.arg == "persistent" and not (
        isinstance(k.value, ast.Constant) and k.value.value is False) for k in call.keywords)


def is_tf_function(expr):
    """A `tf.function` decorator, bare or called: `@tf.function(jit_compile=True)`."""
    if isinstance(expr, ast.Call):
        expr = expr.func
    name = dotted(expr)
    return name in ("tf.function", "tensorflow.function", "function")


def root_name(node):
    """The name an attribute/subscript chain starts from: `model` for `model.layers[0].x`."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def target_key(node):
    """"name" or "self.attr" for the assignment targets the rules track."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None
