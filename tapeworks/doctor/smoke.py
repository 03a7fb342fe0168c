"""The doctor's smoke check: five small things that must work, each timed.

import -> device list -> a matmul on each device (checked against NumPy) ->
a gradient (checked by hand) -> a 5-step `Trainer.fit` (finite loss, weights
changed); and whether XLA compiles. A step that raises is a failed check
with the error's first line, and the later steps still run where they can.
"""

import sys
import time

import numpy as np

from tapeworks.doctor.checks import FAIL, PASS, Check


def _timed(check_id, title, fn):
    start = time.perf_counter()
    try:
        status, found, fix = fn()
    except Exception as error:  # noqa: BLE001 - a smoke check reports any failure
        first = str(error).strip().splitlines()[:1]
        status, found, fix = FAIL, f"{type(error).__name__}: {first[0] if first else ''}", (
            "Run the step by hand to see the whole error; `tapeworks doctor` above may name "
            "the cause.")
    return Check(check_id, title, status, found, fix, seconds=time.perf_counter() - start)


def run(quick=False, import_seconds=None, import_error=None):
    """The smoke checks, in order (the Trainer's fit skipped when `quick`).

    `import_seconds`: how long importing TensorFlow took, where the caller
    imported it; `import_error`: the exception if that import failed (then
    nothing else can run).
    """
    if import_error is not None:
        first = str(import_error).strip().splitlines()[:1]
        return [Check("smoke_import", "import tensorflow", FAIL,
                      f"{type(import_error).__name__}: {first[0] if first else ''}",
                      "Reinstall: pip install --force-reinstall \"tensorflow>=2.20\"; the "
                      "checks above may name a version or library mismatch.")]
    checks = []
    already = "tensorflow" in sys.modules

    def import_tf():
        import tensorflow as tf  # noqa: F401

        return PASS, f"TensorFlow {tf.__version__}" + (
            " (imported before the doctor ran)" if already and import_seconds is None else ""), ""

    check = _timed("smoke_import", "import tensorflow", import_tf)
    if import_seconds is not None:
        check.seconds = import_seconds
    checks.append(check)
    import tensorflow as tf

    def devices():
        found = tf.config.list_logical_devices()
        return PASS, ", ".join(d.name for d in found), ""

    checks.append(_timed("smoke_devices", "device list", devices))

    def matmul():
        rng = np.random.default_rng(0)
        a, b = (rng.normal(size=(128, 128)).astype("float32") for _ in range(2))
        want = a @ b
        results = []
        for device in tf.config.list_logical_devices():
            if device.device_type not in ("CPU", "GPU"):
                continue
            with tf.device(device.name):
                got = tf.matmul(a, b).numpy()
            error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            if error > 1e-2:   # TF32 on GPUs rounds to ~1e-3 of the largest value
                return FAIL, f"{device.name}: wrong result (relative error {error:.2g})", (
                    "The device computes wrong values: check the driver and libraries.")
            results.append(device.name)
        return PASS, "correct on " + ", ".join(results), ""

    checks.append(_timed("smoke_matmul", "a matmul on each device", matmul))

    def gradient():
        x = tf.constant([1.0, 2.0, 3.0])
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(x * x)
        got = tape.gradient(y, x).numpy()
        if not np.allclose(got, [2.0, 4.0, 6.0]):
            return FAIL, f"d(sum x^2)/dx = {got}, expected [2, 4, 6]", ""
        return PASS, "d(sum x^2)/dx = 2x", ""

    checks.append(_timed("smoke_gradient", "a gradient", gradient))

    def xla():
        compiled = tf.function(lambda v: tf.reduce_sum(tf.sin(v) ** 2), jit_compile=True)
        value = float(compiled(tf.ones(8)))
        want = 8 * np.sin(1.0) ** 2
        if abs(value - want) > 1e-4:
            return FAIL, f"an XLA function gave {value}, expected {want:.6f}", ""
        return PASS, "a jit_compile=True function compiles and runs", ""

    checks.append(_timed("xla", "XLA", xla))
    if not quick:
        checks.append(_timed("smoke_fit", "a 5-step Trainer.fit", _fit))
    return checks


def _fit():
    import keras

    from tapeworks import Trainer

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    x = np.random.default_rng(0).normal(size=(40, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    before = [w.numpy().copy() for w in model.weights]
    trainer = Trainer(model, keras.optimizers.SGD(0.01), "mse", plan_cache=False)
    history = trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    loss = history.history["loss"][0]
    changed = any(not np.array_equal(b, w.numpy()) for b, w in zip(before, model.weights))
    if not (np.isfinite(loss) and changed):
        return FAIL, f"loss {loss}, weights changed: {changed}", ""
    return PASS, (f"loss {loss:.4f} after 5 steps (jit_compile={trainer.jit_compile}, "
                  f"steps_per_call={trainer.steps_per_call})"), ""
