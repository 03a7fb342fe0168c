"""Custom Keras classes for the export tests, in a module a fresh process can import."""

import keras


@keras.saving.register_keras_serializable(package="tapeworks_tests")
class Scale(keras.layers.Layer):
    """Multiplies by a constant; its get_config holds it, so a loaded copy is the same."""

    def __init__(self, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def get_config(self):
        return dict(super().get_config(), factor=self.factor)


@keras.saving.register_keras_serializable(package="tapeworks_tests")
class ForgetfulScale(Scale):
    """The classic bug: get_config forgets `factor`; a loaded copy multiplies by 1.

    (Keras 3 records the constructor's arguments for a layer without a
    get_config of its own; the bug needs one that leaves an argument out.)
    """

    def get_config(self):
        return {"name": self.name, "trainable": self.trainable}


class Unregistered(keras.layers.Layer):
    def call(self, x):
        return x + 1.0


@keras.saving.register_keras_serializable(package="tapeworks_tests")
class TwoLayerNet(keras.Model):
    """A subclassed model with a custom layer inside."""

    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(units, activation="relu")
        self.scale = Scale(0.5)
        self.head = keras.layers.Dense(2)

    def call(self, x):
        return self.head(self.scale(self.hidden(x)))

    def get_config(self):
        return dict(super().get_config(), units=self.units)
