"""The static checker: Python's `ast`, no import or execution of the code checked.

One pass per file. `FileFacts` (facts.py) first collects what the whole module
tells (which names hold Keras models, which functions are tf.functions, which
classes subclass keras.Model); `_Checker` then walks the tree keeping the
lexical context each rule needs (enclosing tapes, loops and functions) and a
small per-scope record of dataset pipelines (pipelines.py), integer tensors
(integers.py) and compiled models. Every rule prefers to miss a case over
flagging a correct one: each has a near-miss test that must stay silent.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Collection

from tapeworks.lint.facts import LOSS_SCALING_NAMES, FileFacts
from tapeworks.lint.findings import Finding, kept
from tapeworks.lint.integers import RATIO_NAME, always_zero, is_count, is_int_tensor
from tapeworks.lint.pipelines import DATASET_OPS, STATEFUL_IN_MAP, dataset_ops, stateful_call
from tapeworks.lint.rules import PARSE_ERROR, RULES
from tapeworks.lint.trace_time import TRACED_METHODS, RandomSources
from tapeworks.lint.syntax import (LEAVES, call_name, children, dotted, has_keyword,
                                   is_persistent, is_tape_call, is_tf_function, root_name,
                                   target_key, walk)

__all__ = ["Finding", "check_source", "check_tree"]

KERAS_LOOPS_IN_TAPE = ("predict", "predict_on_batch", "train_on_batch")
TRAINING_CALLS = ("apply_gradients", "train_on_batch", "fit")
CONCAT_FUNCS = re.compile(r"(^|\.)(concat|concatenate|vstack|hstack)$|^(np|numpy)\.append$")
MODEL_NAME = re.compile(
    r"^(.*_)?(model|net|network|generator|gen|discriminator|disc|critic|teacher|student|"
    r"encoder|decoder|backbone|classifier)s?$", re.IGNORECASE)
TRAINING_DEPENDENT_LAYERS = {"Dropout", "BatchNormalization", "SpatialDropout1D",
                             "SpatialDropout2D", "SpatialDropout3D", "GaussianNoise",
                             "GaussianDropout", "AlphaDropout"}

# Names that hold a tf.data pipeline by convention, where the file does not build it.
DATASET_NAME = re.compile(r"(^|_)(ds|dataset)$", re.IGNORECASE)   # also make_dataset()

# Methods that Keras' and tapeworks' loops run under their GradientTape.
TAPED_METHODS = {"train_step", "compute_losses", "compute_loss"}


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
        self.random = RandomSources(tree)   # for TW113

    # Plumbing -------------------------------------------------------------

    def visit(self, node):
        # NodeVisitor's dispatch builds a method name per node; a per-class
        # table and skipping leaves halves the cost of the walk.
        method = _DISPATCH.get(type(node))
        if method is not None:
            return method(self, node)
        if not isinstance(node, LEAVES):
            self.generic_visit(node)

    def generic_visit(self, node):
        for child in children(node):
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
        is_tf = any(is_tf_function(d) for d in node.decorator_list)
        if is_tf and self.loops:
            self.report(node, "TW107", what=f"tf.function `{node.name}` defined inside a "
                                            "loop: a new function, traced anew, each iteration")
        saved = self.tapes, self.loops
        # A custom `train_step` or a Task's `compute_losses` runs under the
        # tape of the loop that calls it: its body counts as taped.
        self.tapes, self.loops = ([node] if node.name in TAPED_METHODS and node.args.args
                                  and node.args.args[0].arg == "self" else []), []
        self.functions.append((node, is_tf))
        self._check_random_at_trace(node, is_tf)
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
        self.loops.append(node)
        self.generic_visit(node)
        self.loops.pop()

    visit_For = visit_While = visit_AsyncFor = _visit_loop

    def visit_With(self, node):
        tapes = []
        for item in node.items:
            self.visit(item.context_expr)
            if is_tape_call(item.context_expr):
                tapes.append(item)
                if is_persistent(item.context_expr) and isinstance(item.optional_vars, ast.Name):
                    self._check_persistent_tape(item.optional_vars.id, node)
            if item.optional_vars is not None:
                self.visit(item.optional_vars)
        self.tapes.extend(tapes)
        for statement in node.body:
            self.visit(statement)
        del self.tapes[len(self.tapes) - len(tapes):]

    visit_AsyncWith = visit_With

    def visit_If(self, node):
        # Each branch extends the pipelines as they were before the `if`; after
        # it, a pipeline is what both branches agree on (their common first
        # steps): a `.batch()` in one branch does not precede a `.shuffle()` in
        # the other (Keras' timeseries_dataset_from_array, a false TW109).
        scope = self.scopes[-1]
        self.visit(node.test)
        before = dict(scope.datasets)
        branches = []
        for body in (node.body, node.orelse):
            scope.datasets = dict(before)
            for statement in body:
                self.visit(statement)
            branches.append(scope.datasets)
        scope.datasets = {name: _common_steps(ops, branches[1][name])
                          for name, ops in branches[0].items() if name in branches[1]}

    # Statements ---------------------------------------------------------

    def visit_Assign(self, node):
        self._statement_values.add(id(node.value))
        self._assign_of[id(node.value)] = node
        self.generic_visit(node)
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr == "trainable":
                self.scopes[-1].compile_events.append(
                    (node.lineno, node.col_offset, "trainable", root_name(target), node))
        value = node.value
        scope = self.scopes[-1]
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(value, ast.Call) and is_tape_call(value) and is_persistent(value):
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
        name = call_name(node) or ""
        attr = func.attr if isinstance(func, ast.Attribute) else None
        if attr in ("compile", "fit", "train_on_batch", "fit_generator") and \
                isinstance(func.value, ast.Name):
            kind = "compile" if attr == "compile" else "train"
            self.scopes[-1].compile_events.append(
                (node.lineno, node.col_offset, kind, func.value.id, node))
        if self.tapes:
            if attr in KERAS_LOOPS_IN_TAPE or (attr == "numpy" and not node.args):
                self.report(node, "TW101", call=f".{attr}()")
            elif self._is_model_call(node) and not has_keyword(node, "training") and any(
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
        if self.loops and is_tf_function(node.func) and isinstance(node.func, ast.Attribute):
            self.report(node, "TW107", what="tf.function created inside a loop: a new "
                                            "function, traced anew, each iteration")
        self._check_python_scalar_to_tf_function(node)
        self._check_inference_mode_call(node)
        if name.split(".")[-1] in ("floordiv", "truncatediv") and len(node.args) == 2 and \
                all(self._is_int_tensor(a) for a in node.args):
            self.report(node, "TW110", expr=f"{name}(...)")
        if attr == "map":
            self._check_random_in_map(node)
        if id(node) not in self._inner_links:
            self._dataset_ops(node)  # checks map and shuffle on the way

    def _check_random_at_trace(self, node, is_tf):
        """TW113 in a tf.function, a Keras train/test step or a Task's compute_losses."""
        method = node.name in TRACED_METHODS and node.args.args and \
            node.args.args[0].arg == "self"
        if not (is_tf or method):
            return
        where = (f"the tf.function `{node.name}`" if is_tf
                 else f"`{node.name}` (traced into the training graph)")
        for call, name in self.random.draws_in(node.body):
            self.report(call, "TW113", call=name, where=where, unit="step")

    def _check_random_in_map(self, call):
        """TW113 in the function a tf.data pipeline's `.map()` traces."""
        receiver = call.func.value
        named = receiver.func if isinstance(receiver, ast.Call) else receiver   # make_dataset()
        known = self._dataset_ops(receiver) is not None or (
            bool(DATASET_NAME.search((dotted(named) or "").split(".")[-1]))
            and self.random.maps_tf_data(call))
        body, where = self.random.mapped_function(call) if known else (None, None)
        for draw, name in self.random.draws_in(body or []):
            self.report(draw, "TW113", call=name, where=where, unit="element")

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
        key = target_key(node.func)
        if key and self.facts.keras_objects.get(key) == "model" and \
                key not in self.facts.frozen:
            self.report(node, "TW112", name=key)

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.FloorDiv) and self._is_int_tensor(node.left) and \
                self._is_int_tensor(node.right) and (self._meant_as_ratio(node, node.left)
                                                     or always_zero(node)):
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

    # Rule helpers ---------------------------------------------------------

    def _is_model_call(self, call):
        key = target_key(call.func)
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
            body = list(walk(self.functions[-1][0]))
            has_tape = any(isinstance(n, ast.Call) and is_tape_call(n) for n in body)
            scaled = any((isinstance(n, ast.Attribute) and n.attr in LOSS_SCALING_NAMES) or
                         (isinstance(n, ast.Name) and n.id in LOSS_SCALING_NAMES) for n in body)
        if has_tape and not scaled:
            self.report(call, "TW111")

    def _check_concat_in_loop(self, node, names):
        if not self.loops or len(names) != 1 or not isinstance(node.value, ast.Call):
            return
        name = call_name(node.value) or ""
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
        for node in walk(self.loops[-1]):
            if isinstance(node, ast.Assign) and node is not growing and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return True
        return False

    def _check_python_scalar_to_tf_function(self, call):
        key = target_key(call.func)
        if key is None or key.split(".")[-1] not in self.facts.tf_functions:
            return
        loop_vars = set()
        for loop in self.loops:
            if isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call) and \
                    call_name(loop.iter) in ("range", "enumerate") and \
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

    # Dataset pipelines and integer tensors, in this scope ---------------------

    def _dataset_ops(self, node):
        return dataset_ops(node, self.scopes[-1].datasets, self.report, self._stateful_map)

    def _stateful_map(self, call):
        """The stateful TF call the function of a `.map(fn)` shows, or None (see pipelines)."""
        named = dotted(call.args[0]) if call.args else None
        if named and STATEFUL_IN_MAP.match(named):   # `.map(tf.py_function...)` itself
            return named
        body, _ = self.random.mapped_function(call)
        return stateful_call(body or [], self.random.callee)

    def _is_int_tensor(self, node):
        return is_int_tensor(node, self.scopes[-1].int_names)

    def _is_count(self, node):
        scope = self.scopes[-1]
        return is_count(node, scope.count_names, scope.int_names)


_DISPATCH = {getattr(ast, name[len("visit_"):]): method
             for name, method in vars(_Checker).items()
             if name.startswith("visit_") and hasattr(ast, name[len("visit_"):])}


def _trainable_owner(assign):
    """"model.layers[0]" for `model.layers[0].trainable = False`."""
    for target in assign.targets:
        if isinstance(target, ast.Attribute) and target.attr == "trainable":
            return ast.unparse(target.value)
    return "?"


def check_tree(tree, path="<string>"):
    """All findings for a parsed module, before noqa and rule selection."""
    return sorted(_Checker(tree, path, FileFacts(tree)).run(tree))


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
    r"|training\s*=\s*False"                          # TW112
    r"|random\.")                                      # TW113


def check_source(source: str, path: str = "<string>", select: Collection[str] | None = None,
                 ignore: Collection[str] = ()) -> list[Finding]:
    """Findings for one file's source text, with `# noqa` and rule selection applied."""
    try:
        # Parsed even when no rule can fire, so that a file that does not
        # parse is reported (as flake8's E999 is) instead of passing.
        tree = ast.parse(source, filename=path)
    except SyntaxError as error:
        return [Finding(path, error.lineno or 1, max((error.offset or 1) - 1, 0), PARSE_ERROR,
                        f"could not parse: {error.msg}")]
    except (RecursionError, MemoryError) as error:
        # Python's own parser gives up on an expression nested too deeply (100,000
        # terms of `1+1+...`): this file is reported, the others are still checked.
        return [too_deep(path, "could not parse", error)]
    if not _TRIGGERS.search(source):
        return []
    try:
        return kept(check_tree(tree, path), source, select, ignore)
    except RecursionError as error:
        return [too_deep(path, "could not check", error)]


def too_deep(path, what, error):
    """The TW000 finding of a file whose nesting Python's parser or the rules cannot follow."""
    return Finding(path, 1, 0, PARSE_ERROR,
                   f"{what}: the code nests too deeply for Python ({type(error).__name__}: "
                   f"{str(error) or 'recursion'}); split the expression into named parts")


def _common_steps(ops, other):
    """The first steps two versions of a pipeline share (`[(op, call)]`, the same calls)."""
    common = []
    for mine, theirs in zip(ops, other):
        if mine[1] is not theirs[1]:
            break
        common.append(mine)
    return common
