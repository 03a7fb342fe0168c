"""TW113: NumPy's or Python's random numbers drawn where TensorFlow traces, not runs, the code.

A function passed to `tf.data.Dataset.map`, a `tf.function`, a Keras
`train_step` or a Task's `compute_losses` is run once as Python to build a
graph; `np.random.uniform()` there is called once and its value becomes a
constant, so every element (every step) gets the same "random" number. The
rule looks inside those functions' own bodies (and, one level down, into
the functions of the same file they call), never into a function handed to
`tf.numpy_function` / `tf.py_function`, which do run per element.
"""

import ast
import re

from tapeworks.lint.syntax import call_name, children, dotted

# `np.random.seed()` and the state functions draw nothing.
NUMPY_RANDOM = re.compile(r"^(np|numpy)\.random\.(?!seed$|get_state$|set_state$)\w+$")
PYTHON_RANDOM = re.compile(r"^random\.(?!seed$|getstate$|setstate$)\w+$")
GENERATOR_FACTORIES = re.compile(r"^(np|numpy)\.random\.(default_rng|RandomState|Generator)$"
                                 r"|^random\.Random$")
PER_ELEMENT_WRAPPERS = ("numpy_function", "py_function", "py_func")
# Methods Keras and tapeworks trace as the training (or test) step.
TRACED_METHODS = {"train_step", "test_step", "compute_losses", "compute_loss"}


class RandomSources:
    """What in a file draws host-side random numbers: the modules and generators bound to names."""

    def __init__(self, tree):
        self.python_random = False   # `import random` (the standard library's module)
        self.generators = set()      # names bound to np.random.default_rng(...) and the like
        self.functions = {}          # name -> FunctionDef, for one level of calls
        self.per_element = set()     # function names handed to tf.numpy_function & co.
        self.uses_tf_data = False    # `tf.data.` appears: a `ds.map` is likely tf.data's
        self.other_datasets = False  # Hugging Face `datasets` (its .map runs per example)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                self.python_random |= any(a.name == "random" and a.asname in (None, "random")
                                          for a in node.names)
                self.other_datasets |= any(a.name == "datasets" for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                self.other_datasets |= (node.module or "").split(".")[0] == "datasets"
            elif isinstance(node, ast.Attribute) and node.attr == "data" and \
                    dotted(node) in ("tf.data", "tensorflow.data"):
                self.uses_tf_data = True
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    GENERATOR_FACTORIES.match(call_name(node.value) or ""):
                for target in node.targets:
                    name = dotted(target)
                    if name:
                        self.generators.add(name)
            elif isinstance(node, ast.Call) and \
                    (call_name(node) or "").split(".")[-1] in PER_ELEMENT_WRAPPERS:
                for arg in list(node.args[:1]) + [k.value for k in node.keywords
                                                  if k.arg == "func"]:
                    name = dotted(arg)
                    if name:
                        self.per_element.add(name.split(".")[-1])

    def draw(self, call):
        """The dotted name of `call` when it draws a host-side random number, else None."""
        name = call_name(call) or ""
        if NUMPY_RANDOM.match(name) and not GENERATOR_FACTORIES.match(name):
            return name
        if self.python_random and PYTHON_RANDOM.match(name):
            return name
        owner = name.rpartition(".")[0]
        if owner and owner in self.generators:
            return name
        return None

    def draws_in(self, body, depth=1):
        """[(call node, name)] of the draws in `body` (nodes), not inside nested functions.

        Calls to a function of this file are followed `depth` levels down
        (reported at the call in `body`).
        """
        found = []
        stack = list(body)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                 ast.ClassDef)):
                continue
            if isinstance(node, ast.Call):
                name = self.draw(node)
                if name:
                    found.append((node, name))
                elif depth > 0:
                    callee = self.callee(node)
                    if callee is not None:
                        inner = self.draws_in(callee.body, depth - 1)
                        if inner:
                            found.append((node, f"{inner[0][1]} (in `{callee.name}`)"))
            stack.extend(children(node))
        return found

    def callee(self, call):
        """The FunctionDef of this file that `call` calls, unless it runs per element."""
        name = call_name(call)
        if not name:
            return None
        last = name.split(".")[-1]
        if last in self.per_element or (name != last and not name.startswith("self.")):
            return None
        return self.functions.get(last)

    def maps_tf_data(self, call):
        """A `.map` call on a receiver only named like a dataset (`ds`, `train_ds`): tf.data's?

        Only in a file that uses tf.data and not Hugging Face `datasets` (whose
        `.map` runs Python per example), or with tf.data's own keywords.
        """
        keywords = {k.arg for k in call.keywords}
        return bool(keywords & {"num_parallel_calls", "deterministic"}) or (
            self.uses_tf_data and not self.other_datasets)

    def mapped_function(self, call):
        """The body nodes of the function a `.map(fn)` call traces, and its name for messages."""
        if not call.args:
            return None, None
        fn = call.args[0]
        if isinstance(fn, ast.Lambda):
            return [fn.body], "the lambda passed to Dataset.map"
        name = dotted(fn)
        if not name:
            return None, None
        last = name.split(".")[-1]
        if last in self.per_element or last not in self.functions:
            return None, None
        return self.functions[last].body, f"`{last}` (passed to Dataset.map)"
