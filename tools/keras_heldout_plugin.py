"""A pytest plugin that runs Keras' own tests with `Model.fit/evaluate/predict` routed through tapeworks.

Keras' test suites (shipped in the installed package, `keras/src/**/*_test.py`)
are a held-out check of the drop-in promise: every test that passes on Keras
should pass when its models train through `tapeworks.Trainer`. Each call
builds a Trainer that uses the model's own loop settings (its compile
configuration, `jit_compile`, `steps_per_execution` as steps per call,
`run_eagerly`), so a test that fixes those keeps them.

    python tools/keras_heldout.py callbacks      # see that script
"""

import keras

import tapeworks

_keras_fit = keras.Model.fit
_keras_evaluate = keras.Model.evaluate
_keras_predict = keras.Model.predict
_trainers = {}   # model id -> (model, Trainer): one per model, as a model has one train function


def _trainer(model):
    known = _trainers.get(id(model))
    if known is not None and known[0] is model and known[2] == _settings(model):
        return known[1]
    run_eagerly, jit, steps, _ = _settings(model)
    trainer = tapeworks.Trainer(model, jit_compile=jit, steps_per_call=steps,
                                run_eagerly=run_eagerly)
    _trainers[id(model)] = (model, trainer, _settings(model))
    return trainer


def _settings(model):
    run_eagerly = bool(model.run_eagerly)
    jit = False if run_eagerly else bool(model.jit_compile)
    steps = model.steps_per_execution if isinstance(model.steps_per_execution, int) else 1
    # A new compile() is a new Trainer, as Keras builds a new train function.
    return run_eagerly, jit, max(1, steps), id(getattr(model, "_compile_config", None))


def _routable(model):
    # Models with a custom train_step/test_step/compute_loss, or not compiled,
    # keep Keras' loop here: the guide's figures were measured so. tapeworks
    # runs a model's own steps since (engine/step/model_step.py), tested against
    # model.fit in tests/engine/step/test_model_step.py, not yet through these tests.
    cls = type(model)
    return (getattr(model, "compiled", False) and model.loss is not None
            and cls.train_step is keras.Model.train_step
            and cls.test_step is keras.Model.test_step
            and cls.compute_loss is keras.Model.compute_loss)


def fit(self, *args, **kwargs):
    if not _routable(self):
        return _keras_fit(self, *args, **kwargs)
    return _trainer(self).fit(*args, **kwargs)


def evaluate(self, *args, **kwargs):
    if not _routable(self) or kwargs.get("_use_cached_eval_dataset"):
        return _keras_evaluate(self, *args, **kwargs)
    return _trainer(self).evaluate(*args, **kwargs)


def pytest_configure(config):
    keras.Model.fit = fit
    keras.Model.evaluate = evaluate
