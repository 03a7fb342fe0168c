"""What a whole module says about its names, collected in one walk before the rules run.

Which names hold Keras models and layers, which functions are tf.functions, which
classes subclass keras.Model, what is frozen, whether loss scaling appears: a rule
that sees `model(x, training=False)` asks these facts what `model` is.
"""

import ast

from tapeworks.lint.syntax import call_name, dotted, is_tf_function, target_key, walk

# Names whose presence means the file scales its loss itself (TW111).
LOSS_SCALING_NAMES = {"LossScaleOptimizer", "scale_loss", "get_scaled_loss",
                      "get_unscaled_gradients", "LossScaleOptimizerV3"}


class FileFacts:
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
        for node in walk(tree):
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
                if any(is_tf_function(d) for d in node.decorator_list):
                    self.tf_functions.add(node.name)
            elif kind is ast.ClassDef:
                for base in node.bases:
                    name = dotted(base) or ""
                    if name.split(".")[-1] in ("Model", "Sequential"):
                        self.model_classes.add(node.name)
        # Subclasses of subclasses, in any order of definition.
        classes = [n for n in walk(tree) if isinstance(n, ast.ClassDef)] \
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
        name = call_name(node) or ""
        if name.split(".")[-1] == "freeze":
            self.frozen.update(k for k in map(target_key, node.args[:1]) if k)
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
        if isinstance(value, ast.Call) and (call_name(value) or "").split(".")[-1] == "Input":
            self.input_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr == "trainable" and \
                    isinstance(value, ast.Constant) and value.value is False:
                key = target_key(target.value)
                if key:
                    self.frozen.add(key)
        if not isinstance(value, ast.Call):
            return
        if is_tf_function(value.func):
            for target in node.targets:
                key = target_key(target)
                if key:
                    self.tf_functions.add(key.split(".")[-1])
        kind = self._keras_kind(value)
        if kind:
            for target in node.targets:
                key = target_key(target)
                if key:
                    self.keras_objects[key] = kind

    def _keras_kind(self, call):
        name = call_name(call) or ""
        last = name.split(".")[-1]
        if last in ("Sequential", "Model") or name.endswith("load_model") or \
                ".applications." in name or last in self.model_classes:
            return "model"
        if ".layers." in name or name.startswith("layers."):
            return last
        return None
