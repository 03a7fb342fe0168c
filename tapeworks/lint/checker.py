"""The static checker: Python's `ast`, no import or execution of the code checked.

One pass per file. `_FileFacts` first collects what the whole module tells
(which names hold Keras models, which functions are tf.functions, which
classes subclass keras.Model); `_Checker` then walks the tree keeping the
lexical context each rule needs (enclosing tapes, loops and functions) and a
small per-scope record of dataset pipelines, integer tensors and compiled
models. Every rule prefers to miss a case over flagging a correct one: each
has a near-miss test that must stay silent.
"""

import ast
import dataclasses
import io
import re
import tokenize

from tapeworks.docs_links import see_docs
from tapeworks.lint.rules import PARSE_ERROR, RULES

KERAS_LOOPS_IN_TAPE = ("predict", "predict_on_batch", "train_on_batch")
TRAINING_CALLS = ("apply_gradients", "train_on_batch", "fit")
CONSUMERS = ("fit", "evaluate", "predict")  # calls that iterate a dataset for a model
CONCAT_FUNCS = re.compile(r"(^|\.)(concat|concatenate|vstack|hstack)$|^(np|numpy)\.append$")
MODEL_NAME = re.compile(
    r"^(.*_)?(model|net|network|generator|gen|discriminator|disc|critic|teacher|student|"
    r"encoder|decoder|backbone|classifier)s?$", re.IGNORECASE)
TRAINING_DEPENDENT_LAYERS = {"Dropout", "BatchNormalization", "SpatialDropout1D",
                             "SpatialDropout2D", "SpatialDropout3D", "GaussianNoise",
                             "GaussianDropout", "AlphaDropout"}
DATASET_OPS = {"map", "batch", "padded_batch", "ragged_batch", "shuffle", "prefetch", "cache",
               "repeat", "unbatch", "filter", "take", "skip", "interleave", "flat_map",
               "apply", "with_options", "rebatch", "shard", "enumerate", "window",
               "snapshot", "concatenate", "map_with_legacy_function", "parallel_interleave"}
DATASET_ROOT = re.compile(r"(^|\.)data\.(Dataset|TFRecordDataset|TextLineDataset|"
                          r"FixedLengthRecordDataset|experimental)|(^|\.)Dataset\.\w+$|"
                          r"^(TFRecordDataset|TextLineDataset)$")
INT_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
INT_RESULT_FUNCS = {"size", "shape", "rank", "argmax", "argmin", "count_nonzero"}
REDUCTIONS = {"reduce_sum", "reduce_prod", "reduce_max", "reduce_min", "abs", "add",
              "subtract", "multiply", "maximum", "minimum", "square"}
RATIO_NAME = re.compile(r"acc|ratio|rate|frac|percent|share|mean|avg|precision|recall",
                        re.IGNORECASE)
LOSS_SCALING_NAMES = {"LossScaleOptimizer", "scale_loss", "get_scaled_loss",
                      "get_unscaled_gradients", "LossScaleOptimizerV3"}


# Nodes with nothing inside that any rule looks at: contexts, operators, constants.
_LEAVES = (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop, ast.Constant)


# Methods that Keras' and tapeworks' loops run under their GradientTape.
TAPED_METHODS = {"train_step", "compute_losses", "compute_loss"}


def _children(node):
    """The child nodes of `node`: `ast.iter_child_nodes`, without its per-field generator."""
    for field in node._fields:
        value = getattr(node, field, None)
        if isinstance(value, list):
            for item in value:
                if isinstance(item, ast.AST) and not isinstance(item, _LEAVES):
                    yield item
        elif isinstance(value, ast.AST) and not isinstance(value, _LEAVES):
            yield value


def _walk(tree):
    """Every node below `tree` (order irrelevant), skipping leaves: a faster `ast.walk`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(_children(node))


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    col: int
    code: str
    message: str

    def as_text(self):
        return (f"{self.path}:{self.line}:{self.col + 1}: {self.code} {self.message} "
                f"({see_docs(self.code)})")

    def as_dict(self):
        return dataclasses.asdict(self) | {"col": self.col + 1}


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


def _call_name(call):
    return dotted(call.func) if isinstance(call, ast.Call) else None


def _has_keyword(call, name):
    return any(k.arg == name or k.arg is None for k in call.keywords)


def _is_tape_call(node):
    name = _call_name(node)
    return bool(name) and (name == "GradientTape" or name.endswith(".GradientTape"))


def _is_persistent(call):
    return any(k.arg == "persistent" and not (isinstance(k.value, ast.Constant)
                                               and k.value.value is False)
               for k in call.keywords)


def _is_tf_function(expr):
    """A `tf.function` decorator, bare or called: `@tf.function(jit_compile=True)`."""
    if isinstance(expr, ast.Call):
        expr = expr.func
    name = dotted(expr)
    return name in ("tf.function", "tensorflow.function", "function")


def _root_name(node):
    """The name an attribute/subscript chain starts from: `model` for `model.layers[0].x`."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _target_key(node):
    """"name" or "self.attr" for the assignment targets the rules track."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


class _FileFacts:
    """What the module as a whole says about its names (one walk over the tree)."""

    def __init__(self, tree):
        self.model_classes = set()
        self.keras_objects = {}    # name or "self.attr" -> "model" or layer class name
        self.tf_functions = set()
        self.has_tape = False
        self.loss_scaling = False
        self.float16_policy_calls = []
        self.frozen = set()        # names set `trainable = False` or passed to `.freeze(`
        self.input_names = set()   # names assigned a `keras.Input(...)`
        assigns = []
        for node in _walk(tree):
            kind = type(node)
            if kind is ast.Call:
                self._call(node)
            elif kind is ast.Assign:
                assigns.append(node)
            elif kind is ast.Attribute:
                if node.attr in LOSS_SCALING_NAMES:
                    self.loss_scaling = True
            elif kind is ast.Name:
                if node.id in LOSS_SCALING_NAMES:
                    self.loss_scaling = True
            elif kind in (ast.FunctionDef, ast.AsyncFunctionDef):
                if any(_is_tf_function(d) for d in node.decorator_list):
                    self.tf_functions.add(node.name)
            elif kind is ast.ClassDef:
                for base in node.bases:
                    name = dotted(base) or ""
                    if name.split(".")[-1] in ("Model", "Sequential"):
                        self.model_classes.add(node.name)
        # Subclasses of subclasses, in any order of definition.
        classes = [n for n in _walk(tree) if isinstance(n, ast.ClassDef)] \
            if self.model_classes else []
        grew = True
        while grew:
            grew = False
            for node in classes:
                if node.name not in self.model_classes and any(
                        (dotted(b) or "") in self.model_classes for b in node.bases):
                    self.model_classes.add(node.name)
                    grew = True
        for node in assigns:
            self._assign(node)

    def _call(self, node):
        name = _call_name(node) or ""
        if name.split(".")[-1] == "freeze":
            self.frozen.update(k for k in map(_target_key, node.args[:1]) if k)
        if name == "GradientTape" or name.endswith(".GradientTape"):
            self.has_tape = True
        elif name.endswith("set_global_policy") and node.args:
            policy = node.args[0]
            if isinstance(policy, ast.Call) and policy.args:
                policy = policy.args[0]
            if isinstance(policy, ast.Constant) and policy.value == "mixed_float16":
                self.float16_policy_calls.append(node)

    def _assign(self, node):
        value = node.value
        if isinstance(value, ast.Call) and (_call_name(value) or "").split(".")[-1] == "Input":
            self.input_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr == "trainable" and \
                    isinstance(value, ast.Constant) and value.value is False:
                key = _target_key(target.value)
                if key:
                    self.frozen.add(key)
        if not isinstance(value, ast.Call):
            return
        if _is_tf_function(value.func):
            for target in node.targets:
                key = _target_key(target)
                if key:
                    self.tf_functions.add(key.split(".")[-1])
        kind = self._keras_kind(value)
        if kind:
            for target in node.targets:
                key = _target_key(target)
                if key:
                    self.keras_objects[key] = kind

    def _keras_kind(self, call):
        name = _call_name(call) or ""
        last = name.split(".")[-1]
        if last in ("Sequential", "Model") or name.endswith("load_model") or \
                ".applications." in name or last in self.model_classes:
            return "model"
        if ".layers." in name or name.startswith("layers."):
            return last
        return None


@dataclasses.dataclass
class _Scope:
    node: ast.AST
    datasets: dict = dataclasses.field(default_factory=dict)   # name -> [(op, call)]
    compile_events: list = dataclasses.field(default_factory=list)  # for TW108
    int_names: set = dataclasses.field(default_factory=set)
    count_names: set = dataclasses.field(default_factory=set)


class _Checker(ast.NodeVisitor):
    def __init__(self, tree, path, facts):
        self.path = path
        self.facts = facts
        self.findings = []
        self._seen = set()
        self.tapes = []       # enclosing `with GradientTape` nodes (this function)
        self.loops = []       # enclosing for/while nodes (this function)
        self.functions = []   # enclosing function defs: (node, is_tf_function)
        self.scopes = []
        # Calls that are links inside a longer tf.data chain, and values of
        # statements: found on the way down, instead of a map of parents.
        self._inner_links = set()
        self._statement_values = set()
        self._assign_of = {}   # id(value) -> the Assign it is the value of

    # Plumbing -------------------------------------------------------------

    def visit(self, node):
        # NodeVisitor's dispatch builds a method name per node; a per-class
        # table and skipping leaves halves the cost of the walk.
        method = _DISPATCH.get(type(node))
        if method is not None:
            return method(self, node)
        if not isinstance(node, _LEAVES):
            self.generic_visit(node)

    def generic_visit(self, node):
        for child in _children(node):
            self.visit(child)

    def report(self, node, code, **fields):
        # Pipelines and scopes are looked at more than once; a finding is kept once.
        line, col = node.lineno, node.col_offset
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            # Point at the method name of a chained call (`.map(`), not the chain's start.
            line = node.func.end_lineno
            col = node.func.end_col_offset - len(node.func.attr)
        finding = Finding(self.path, line, col, code, RULES[code].message.format(**fields))
        if finding not in self._seen:
            self._seen.add(finding)
            self.findings.append(finding)

    def run(self, tree):
        self._enter_scope(tree)
        self.generic_visit(tree)
        self._leave_scope()
        return self.findings

    def _enter_scope(self, node):
        self.scopes.append(_Scope(node))

    def _leave_scope(self):
        scope = self.scopes.pop()
        self._check_trainable_after_compile(scope.compile_events)


    def visit_FunctionDef(self, node):
        for decorator in node.decorator_list:
            self.visit(decorator)
        is_tf = any(_is_tf_function(d) for d in node.decorator_list)
        if is_tf and self.loops:
            self.report(node, "TW107", what=f"tf.function `{node.name}` defined inside a "
                                             "loop: a new function, traced anew, each iteration")
        saved = self.tapes, self.loops
        # A custom `train_step` or a Task's `compute_losses` runs under the
        # tape of the loop that calls it: its body counts as taped.
        self.tapes, self.loops = ([node] if node.name in TAPED_METHODS and node.args.args
                                  and node.args.args[0].arg == "self" else []), []
        self.functions.append((node, is_tf))
        self._enter_scope(node)
        for statement in node.body:
            self.visit(statement)
        self._leave_scope()
        self.functions.pop()
        self.tapes, self.loops = saved

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        saved = self.tapes, self.loops
        self.tapes, self.loops = [], []
        self.generic_visit(node)
        self.tapes, self.loops = saved

    def _visit_loop(self, node):
        if isinstance(node, (ast.For, ast.AsyncFor)):
            self._check_consumed(node.iter)
        self.loops.append(node)
        self.generic_visit(node)
        self.loops.pop()

    visit_For = visit_While = visit_AsyncFor = _visit_loop

    def visit_With(self, node):
        tapes = []
        for item in node.items:
            self.visit(item.context_expr)
            if _is_tape_call(item.context_expr):
                tapes.append(item)
                if _is_persistent(item.context_expr) and isinstance(item.optional_vars, ast.Name):
                    self._check_persistent_tape(item.optional_vars.id, node)
            if item.optional_vars is not None:
                self.visit(item.optional_vars)
        self.tapes.extend(tapes)
        for statement in node.body:
            self.visit(statement)
        del self.tapes[len(self.tapes) - len(tapes):]

    visit_AsyncWith = visit_With

    # Statements ---------------------------------------------------------

    def visit_Assign(self, node):
        self._statement_values.add(id(node.value))
        self._assign_of[id(node.value)] = node
        self.generic_visit(node)
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr == "trainable":
                self.scopes[-1].compile_events.append(
                    (node.lineno, node.col_offset, "trainable", _root_name(target), node))
        value = node.value
        scope = self.scopes[-1]
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(value, ast.Call) and _is_tape_call(value) and _is_persistent(value):
            for name in names:
                self._check_persistent_tape(name, node)
        for name in names:
            if self._is_int_tensor(value):
                scope.int_names.add(name)
            else:
                scope.int_names.discard(name)
            if self._is_count(value):
                scope.count_names.add(name)
            else:
                scope.count_names.discard(name)
        self._check_concat_in_loop(node, names)
        ops = self._dataset_ops(value)
        for name in names:
            if ops is not None:
                scope.datasets[name] = ops
            else:
                scope.datasets.pop(name, None)

    def visit_Expr(self, node):
        self._statement_values.add(id(node.value))
        self.generic_visit(node)

    def visit_Return(self, node):
        if node.value is not None:
            self._statement_values.add(id(node.value))
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in DATASET_OPS and \
                isinstance(func.value, ast.Call):
            self._inner_links.add(id(func.value))
        self.generic_visit(node)
        name = _call_name(node) or ""
        attr = func.attr if isinstance(func, ast.Attribute) else None
        if attr in ("compile", "fit", "train_on_batch", "fit_generator") and \
                isinstance(func.value, ast.Name):
            kind = "compile" if attr == "compile" else "train"
            self.scopes[-1].compile_events.append(
                (node.lineno, node.col_offset, kind, func.value.id, node))
        if self.tapes:
            if attr in KERAS_LOOPS_IN_TAPE or (attr == "numpy" and not node.args):
                self.report(node, "TW101", call=f".{attr}()")
            elif self._is_model_call(node) and not _has_keyword(node, "training") and any(
                    not isinstance(t, ast.FunctionDef) for t in self.tapes):
                # Only under an explicit tape: inside a train_step/compute_loss the
                # model's output is usually computed already, and the helpers called
                # there (label encoders, metrics) rarely depend on `training`
                # (keras-hub's RetinaNet label encoder was a false positive).
                self.report(node, "TW104", call=f"{dotted(node.func)}(...)")
        elif attr in ("predict", "predict_on_batch") and self._in_training_loop():
            self.report(node, "TW102", call=f"{dotted(node.func) or attr}()")
        if any(node is call for call in self.facts.float16_policy_calls):
            self._check_float16_loop(node)
        if name == "print" and self.functions and self.functions[-1][1]:
            self.report(node, "TW103")
        if self.loops and _is_tf_function(node.func) and isinstance(node.func, ast.Attribute):
            self.report(node, "TW107", what="tf.function created inside a loop: a new "
                                            "function, traced anew, each iteration")
        self._check_python_scalar_to_tf_function(node)
        self._check_inference_mode_call(node)
        if name.split(".")[-1] in ("floordiv", "truncatediv") and len(node.args) == 2 and \
                all(self._is_int_tensor(a) for a in node.args):
            self.report(node, "TW110", expr=f"{name}(...)")
        if id(node) not in self._inner_links:
            self._dataset_ops(node)  # checks map and shuffle on the way
        if attr in CONSUMERS or name == "iter":
            # A pipeline handed to training or iterated should end with prefetch.
            for arg in node.args[:1]:
                self._check_consumed(arg)

    def _check_inference_mode_call(self, node):
        """TW112: a model the file knows, called with training=False, never frozen.

        Only where training happens: under a tape (or in a train_step /
        compute_loss(es)), or on a `keras.Input` while a model is built. An
        evaluation call (`validation_step`, a test of inference) is what
        training=False is for (two false positives in tf-models-official
        before this condition).
        """
        training = next((k.value for k in node.keywords if k.arg == "training"), None)
        if not (isinstance(training, ast.Constant) and training.value is False):
            return
        on_input = bool(node.args) and isinstance(node.args[0], ast.Name) and \
            node.args[0].id in self.facts.input_names
        if not (self.tapes or on_input):
            return
        key = _target_key(node.func)
        if key and self.facts.keras_objects.get(key) == "model" and \
                key not in self.facts.frozen:
            self.report(node, "TW112", name=key)

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.FloorDiv) and self._is_int_tensor(node.left) and \
                self._is_int_tensor(node.right) and (self._meant_as_ratio(node, node.left)
                                                     or _always_zero(node)):
            self.report(node, "TW110", expr=ast.unparse(node))

    def _meant_as_ratio(self, division, numerator):
        """A count divided (correct // total), or a result named like a ratio.

        Integer division is right for sizes and strides (`border // divisor`);
        the bug is a count of successes floor-divided by a total.
        """
        if self._is_count(numerator):
            return True
        assign = self._assign_of.get(id(division))
        return assign is not None and any(
            isinstance(t, ast.Name) and RATIO_NAME.search(t.id) for t in assign.targets)

    def _is_count(self, node):
        if isinstance(node, ast.Name):
            return node.id in self.scopes[-1].count_names
        if isinstance(node, ast.Call):
            last = (_call_name(node) or "").split(".")[-1]
            return last in ("reduce_sum", "count_nonzero") and self._is_int_tensor(node)
        return False

    # Rule helpers ---------------------------------------------------------

    def _is_model_call(self, call):
        key = _target_key(call.func)
        if key is None:
            return False
        kind = self.facts.keras_objects.get(key)
        if kind == "model" or kind in TRAINING_DEPENDENT_LAYERS:
            return True
        if kind is not None:
            return False  # a known layer whose behaviour does not depend on training
        return bool(MODEL_NAME.match(key.split(".")[-1]))

    def _in_training_loop(self):
        for loop in self.loops:
            for node in ast.walk(loop):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr in TRAINING_CALLS:
                    return True
        return False

    def _check_persistent_tape(self, name, node):
        def deleted_in(tree):
            return any(isinstance(n, ast.Delete) and any(
                isinstance(t, ast.Name) and t.id == name for t in n.targets)
                for n in ast.walk(tree))

        if self.loops and not deleted_in(self.loops[-1]):
            self.report(node, "TW105", name=name,
                        problem="created in a loop and not deleted in it")
        elif not self.loops and not deleted_in(self.scopes[-1].node):
            self.report(node, "TW105", name=name, problem="never deleted")

    def _check_float16_loop(self, call):
        """TW111: a tape loop in the same function (or a module-level script), unscaled."""
        if not self.functions:
            has_tape, scaled = self.facts.has_tape, self.facts.loss_scaling
        else:
            body = list(_walk(self.functions[-1][0]))
            has_tape = any(isinstance(n, ast.Call) and _is_tape_call(n) for n in body)
            scaled = any((isinstance(n, ast.Attribute) and n.attr in LOSS_SCALING_NAMES) or
                         (isinstance(n, ast.Name) and n.id in LOSS_SCALING_NAMES) for n in body)
        if has_tape and not scaled:
            self.report(call, "TW111")

    def _check_concat_in_loop(self, node, names):
        if not self.loops or len(names) != 1 or not isinstance(node.value, ast.Call):
            return
        name = _call_name(node.value) or ""
        if not CONCAT_FUNCS.search(name) or not node.value.args or "layers." in name:
            return  # (keras.layers.concatenate builds a graph, it copies nothing)
        first = node.value.args[0]
        target = names[0]
        if name.endswith(".append"):
            grows = isinstance(first, ast.Name) and first.id == target
        else:
            grows = isinstance(first, (ast.List, ast.Tuple)) and any(
                isinstance(p, ast.Name) and p.id == target for p in first.elts)
        if grows and not self._reset_in_loop(target, node):
            self.report(node, "TW106", name=target, call=name)

    def _reset_in_loop(self, name, growing):
        """True when `name` is also assigned afresh in the innermost loop: no growth across it."""
        for node in _walk(self.loops[-1]):
            if isinstance(node, ast.Assign) and node is not growing and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return True
        return False

    def _check_python_scalar_to_tf_function(self, call):
        key = _target_key(call.func)
        if key is None or key.split(".")[-1] not in self.facts.tf_functions:
            return
        loop_vars = set()
        for loop in self.loops:
            if isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call) and \
                    _call_name(loop.iter) in ("range", "enumerate") and \
                    isinstance(loop.target, (ast.Name, ast.Tuple)):
                targets = [loop.target] if isinstance(loop.target, ast.Name) else \
                    loop.target.elts[:1]
                loop_vars.update(t.id for t in targets if isinstance(t, ast.Name))
        for arg in list(call.args) + [k.value for k in call.keywords]:
            if self._python_value_of(arg, loop_vars):
                self.report(call, "TW107", what=(
                    f"`{key}` is a tf.function called with the Python loop counter "
                    f"`{ast.unparse(arg)}`: it retraces for every value"))
                return

    @staticmethod
    def _python_value_of(arg, loop_vars):
        if isinstance(arg, ast.Name):
            return arg.id in loop_vars
        if isinstance(arg, ast.BinOp):
            return any(isinstance(n, ast.Name) and n.id in loop_vars for n in ast.walk(arg)) \
                and not any(isinstance(n, ast.Call) for n in ast.walk(arg))
        return False

    def _check_trainable_after_compile(self, events):
        """TW108, over one scope's compile/train/trainable events in source order."""
        events.sort(key=lambda e: (e[0], e[1]))
        compiled = []
        pending = []   # (assign node, name changed, candidate models)
        for _, _, kind, owner, node in events:
            if kind == "compile":
                compiled.append(owner)
                pending = [(n, name, {m for m in models if m != owner})
                           for n, name, models in pending]
                pending = [p for p in pending if p[2]]
            elif kind == "trainable" and compiled and owner:
                models = {owner} if owner in compiled else set(compiled)
                pending.append((node, owner, models))
            elif kind == "train":
                for assign, name, models in pending:
                    if owner in models:
                        self.report(assign, "TW108", name=_trainable_owner(assign),
                                    model=owner)

    # Dataset pipelines ------------------------------------------------------

    def _dataset_ops(self, node):
        """[(op, call)] of a tf.data pipeline expression, checking map/shuffle on the way."""
        chain = []
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in DATASET_OPS:
            chain.append((node.func.attr, node))
            node = node.func.value
        chain.reverse()
        scope = self.scopes[-1]
        if isinstance(node, ast.Name) and node.id in scope.datasets:
            prefix = scope.datasets[node.id]
        elif isinstance(node, ast.Call) and DATASET_ROOT.search(_call_name(node) or ""):
            prefix = []
        else:
            return None
        if not chain and not prefix and not isinstance(node, ast.Call):
            return None
        ops = prefix + chain
        for index, (op, call) in enumerate(ops[len(prefix):], len(prefix)):
            if op == "map" and not _has_keyword(call, "num_parallel_calls") and \
                    len(call.args) < 2:
                self.report(call, "TW109", what=".map() without num_parallel_calls runs "
                                                "one element at a time")
            if op == "shuffle":
                before = [o for o, _ in ops[:index]]
                last_batch = max((i for i, o in enumerate(before)
                                  if o in ("batch", "padded_batch")), default=None)
                if last_batch is not None and "unbatch" not in before[last_batch:]:
                    self.report(call, "TW109", what=".shuffle() after .batch() shuffles "
                                                    "whole batches, not samples")
        return ops

    def _check_consumed(self, expr):
        if isinstance(expr, ast.Name):
            ops = self.scopes[-1].datasets.get(expr.id)
            if ops is not None:
                self._check_prefetch(ops, expr.id)
        elif isinstance(expr, ast.Call):
            ops = self._dataset_ops(expr)
            if ops is not None:
                self._check_prefetch(ops, None)

    def _check_prefetch(self, ops, name):
        names = [op for op, _ in ops]
        batches = [i for i, op in enumerate(names) if op in ("batch", "padded_batch")]
        if not batches or "prefetch" in names[batches[-1]:]:
            return
        subject = f"the batched tf.data pipeline `{name}`" if name else \
            "this batched tf.data pipeline"
        self.report(ops[-1][1], "TW109", what=f"{subject} does not end with .prefetch(): the "
                                              "step waits for every batch")

    # Integer tensors ------------------------------------------------------

    def _is_int_tensor(self, node):
        scope = self.scopes[-1]
        if isinstance(node, ast.Name):
            return node.id in scope.int_names
        if isinstance(node, ast.Subscript):
            return self._is_int_tensor(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            return self._is_int_tensor(node.left) and self._is_int_tensor(node.right)
        if not isinstance(node, ast.Call):
            return False
        name = _call_name(node) or ""
        base, _, last = name.rpartition(".")
        if not base.split(".")[0] in ("tf", "tensorflow"):
            return False
        dtype = next((k.value for k in node.keywords if k.arg in ("dtype", "out_type",
                                                                  "output_type")), None)
        if last == "cast" and len(node.args) >= 2:
            dtype = node.args[1]
        if dtype is not None:
            return _dtype_name(dtype) in INT_DTYPES
        if last in INT_RESULT_FUNCS or _literal_int(node) is not None:
            return True
        if last in REDUCTIONS and node.args:
            return self._is_int_tensor(node.args[0])
        return False


_DISPATCH = {getattr(ast, name[len("visit_"):]): method
             for name, method in vars(_Checker).items()
             if name.startswith("visit_") and hasattr(ast, name[len("visit_"):])}


def _literal_int(node):
    """7 for `tf.constant(7)` (no dtype, an int literal), else None."""
    if not (isinstance(node, ast.Call) and (_call_name(node) or "").split(".")[-1] == "constant"
            and (_call_name(node) or "").split(".")[0] in ("tf", "tensorflow")
            and node.args and not node.keywords):
        return None
    value = node.args[0]
    if isinstance(value, ast.Constant) and type(value.value) is int:
        return value.value
    return None


def _always_zero(division):
    """`tf.constant(7) // tf.constant(10)`: constants whose floor division is always 0."""
    left, right = _literal_int(division.left), _literal_int(division.right)
    return left is not None and right is not None and 0 <= left < right


def _dtype_name(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    name = dotted(node)
    return name.split(".")[-1] if name else None


def noqa_codes(line):
    """None (no noqa), "all" (bare `# noqa`), or the set of codes a line suppresses."""
    match = re.search(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?",
                      line, re.IGNORECASE)
    if not match:
        return None
    if not match.group("codes"):
        return "all"
    return {c.upper() for c in re.split(r"[\s,]+", match.group("codes")) if c}


def _comment_lines(source):
    """{line number: comment text}; comments only, so a '# noqa' in a string does not count."""
    comments = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                comments[token.start[0]] = token.string
    except (tokenize.TokenError, SyntaxError):
        pass
    return comments


def _trainable_owner(assign):
    """"model.layers[0]" for `model.layers[0].trainable = False`."""
    for target in assign.targets:
        if isinstance(target, ast.Attribute) and target.attr == "trainable":
            return ast.unparse(target.value)
    return "?"


def check_tree(tree, path="<string>"):
    """All findings for a parsed module, before noqa and rule selection."""
    return sorted(_Checker(tree, path, _FileFacts(tree)).run(tree))


# A file none of whose rules' trigger words appears cannot produce a finding:
# skipping its walk keeps large trees fast.
_TRIGGERS = re.compile(
    r"GradientTape"                                   # TW101, TW104, TW105, TW111
    r"|\.predict(_on_batch)?\("                        # TW102
    r"|[.@]function\b"                                # TW103, TW107 (tf.function)
    r"|concat|vstack|hstack|(np|numpy)\.append"       # TW106
    r"|\.trainable\s*="                               # TW108
    r"|\.(map|batch|padded_batch|shuffle)\("          # TW109
    r"|(?<![:/])//|floordiv|truncatediv"              # TW110 (not the // of a URL)
    r"|mixed_float16"                                 # TW111
    r"|training\s*=\s*False")                          # TW112


def check_source(source, path="<string>", select=None, ignore=()):
    """Findings for one file's source text, with `# noqa` and rule selection applied."""
    try:
        # Parsed even when no rule can fire, so that a file that does not
        # parse is reported (as flake8's E999 is) instead of passing.
        tree = ast.parse(source, filename=path)
    except SyntaxError as error:
        return [Finding(path, error.lineno or 1, max((error.offset or 1) - 1, 0), PARSE_ERROR,
                        f"could not parse: {error.msg}")]
    if not _TRIGGERS.search(source):
        return []
    findings = check_tree(tree, path)
    # Tokenizing costs as much as parsing: only when a noqa could matter.
    comments = _comment_lines(source) if findings and "noqa" in source.lower() else {}
    kept = []
    for finding in findings:
        if select and not any(finding.code.startswith(s) for s in select):
            continue
        if any(finding.code.startswith(i) for i in ignore):
            continue
        codes = noqa_codes(comments.get(finding.line, ""))
        if codes == "all" or (codes and finding.code in codes):
            continue
        kept.append(finding)
    return kept
