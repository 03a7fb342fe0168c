"""What an artefact serves: raw named inputs -> preprocessing -> model -> named outputs.

`Serving` is the one function every format holds (the SavedModel's
`serving_default`, the LiteRT model converted from it, the `.keras` archive's
model with the preprocessing in front), the reference outputs the artefact
is compared with, and what a `.keras` archive cannot hold safely.
"""

import keras
import numpy as np
import tensorflow as tf

from tapeworks.deploy import verify as verify_lib
from tapeworks.errors import ConfigError


class Serving:
    """What an artefact serves: raw named inputs -> preprocessing -> model -> named outputs."""

    def __init__(self, model, preprocessing, inputs, signatures=None):
        self.model = model
        self.preprocessing = preprocessing
        self.signatures = {name: self._named(fn) for name, fn in (signatures or {}).items()}
        self.names = list(inputs)
        self.specs = [tf.TensorSpec((None,) + array.shape[1:], tf.as_dtype(array.dtype), name=n)
                      for n, array in inputs.items()]

    def __call__(self, *tensors):
        raw = tensors[0] if len(tensors) == 1 else list(tensors)
        features = self.preprocessing(raw) if self.preprocessing is not None else raw
        outputs = self.model(features, training=False)
        if isinstance(outputs, dict):
            return dict(outputs)
        flat = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        return dict(zip(verify_lib.output_names(self.model, len(flat)), flat))

    @staticmethod
    def _named(fn):
        def signature(*tensors):
            outputs = fn(*tensors)
            return dict(outputs) if isinstance(outputs, dict) else {"output_0": outputs}
        return signature

    def reference(self, inputs, signature=None):
        """Outputs on `inputs` of the model (or of an extra signature), as numpy, by name."""
        fn = self if signature is None else self.signatures[signature]
        outputs = fn(*[tf.constant(inputs[name]) for name in self.names])
        return {name: np.asarray(value) for name, value in outputs.items()}

    def write_saved_model(self, folder):
        archive = keras.export.ExportArchive()
        archive.track(self.model)
        if isinstance(self.preprocessing, keras.layers.Layer):
            archive.track(self.preprocessing)
        archive.add_endpoint("serving_default", self, input_signature=self.specs)
        for name, fn in self.signatures.items():
            archive.add_endpoint(name, fn, input_signature=self.specs)
        archive.write_out(folder, verbose=False)

    def keras_model(self):
        """The model, preceded by the preprocessing layer when there is one."""
        if self.preprocessing is None:
            return self.model
        raw = [keras.Input(shape=spec.shape[1:], dtype=spec.dtype.name, name=spec.name)
               for spec in self.specs]
        features = self.preprocessing(raw[0] if len(raw) == 1 else raw)
        return keras.Model(raw if len(raw) > 1 else raw[0], self.model(features),
                           name=f"{self.model.name}_with_preprocessing")

    def layers(self):
        """Every layer of the model and of a preprocessing layer or model, nested ones too."""
        parts = [self.model] + ([self.preprocessing]
                                if isinstance(self.preprocessing, keras.layers.Layer) else [])
        return [layer for part in parts for layer in part._flatten_layers(include_self=True)]

    def layer_order(self):
        """The names of `layers()` in the order they run: the preprocessing's first."""
        first = set(self.preprocessing_layer_names())
        names = [layer.name for layer in self.layers()]
        return [n for n in names if n in first] + [n for n in names if n not in first]

    def output_layers(self, output_names):
        """{output name: the model's layer that computes it}, where the model says.

        `output_names` are the signature's outputs, in the model's output order.
        """
        tensors = getattr(self.model, "outputs", None) or []
        if len(tensors) != len(output_names):
            return {}
        found = {}
        for name, tensor in zip(output_names, tensors):
            for layer in self.model.layers:
                try:
                    output = layer.output
                except (AttributeError, ValueError):   # never called, or called twice
                    continue
                if output is tensor:
                    found[name] = layer.name
        return found

    def preprocessing_layer_names(self):
        """Names of the preprocessing's layers (none for a function)."""
        names, waiting = set(), [self.preprocessing]
        while waiting:   # a model's layers, and theirs (Keras' public `layers`)
            layer = waiting.pop()
            if isinstance(layer, keras.layers.Layer):
                names.add(layer.name)
                waiting += list(getattr(layer, "layers", None) or [])
        return names

    def _custom_classes(self):
        seen = {}
        for layer in self.layers():
            cls = type(layer)
            if not cls.__module__.startswith("keras."):
                seen[cls] = layer.name
        loss = getattr(self.model, "loss", None)
        if loss is not None and not isinstance(loss, str):
            cls = loss if isinstance(loss, type) or callable(loss) and not hasattr(
                loss, "get_config") else type(loss)
            module = getattr(cls, "__module__", "") or ""
            if not module.startswith("keras."):
                seen[cls] = "the compiled loss"
        return seen

    def check_keras_archive(self):
        """Refuses what a .keras archive cannot load safely, or without custom_objects."""
        lambdas = [layer.name for layer in self.layers()
                   if isinstance(layer, keras.layers.Lambda)]
        if lambdas:
            raise ConfigError(
                f"The model has Lambda layer(s) {', '.join(map(repr, lambdas))}: a .keras "
                "archive stores a Lambda's Python code as bytecode, and loading it needs "
                "safe_mode=False, which runs code from the file. Nothing was written. Expected "
                "layers a safe load can rebuild. Fix: write the computation as a custom layer "
                "registered with @keras.saving.register_keras_serializable(), or "
                "format=\"saved_model\" (a traced graph: no Python code to run).")
        for cls, where in self._custom_classes().items():
            registered = keras.saving.get_registered_object(keras.saving.get_registered_name(cls))
            if registered is not cls:
                raise ConfigError(
                    f"{cls.__module__}.{cls.__qualname__} ({where}) is not registered with "
                    "Keras: the .keras archive would name it, and loading it would need "
                    "`custom_objects=`. Nothing was written. Fix: decorate the class with "
                    "@keras.saving.register_keras_serializable(package=\"<your package>\") "
                    "(and give it a get_config() that holds its constructor's arguments), or "
                    "format=\"saved_model\".")

    def modules(self):
        """The modules a fresh process must import to rebuild the custom classes."""
        return sorted({cls.__module__ for cls in self._custom_classes()})
