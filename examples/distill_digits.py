"""Distilling a frozen teacher into a smaller student, on scikit-learn's digits.

The teacher is trained first (plain supervised Trainer), then declared frozen
in the distillation task: it runs with training=False, gets no optimizer
slots, and its weights stay bitwise unchanged. The student learns from the
labels and from the teacher's softened outputs (Hinton et al., 2015).

    python examples/distill_digits.py [--quick]
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tapeworks  # noqa: E402


def digits_split(seed=0):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = (x[order] / 16.0).astype("float32"), y[order].astype("int32")
    return (x[:1400], y[:1400]), (x[1400:], y[1400:])


def mlp(widths, name):
    layers = [keras.Input((64,))] + [keras.layers.Dense(w, activation="relu") for w in widths]
    return keras.Sequential(layers + [keras.layers.Dense(10)], name=name)


class Distillation(tapeworks.Task):
    def __init__(self, student, teacher, temperature=4.0, alpha=0.3):
        super().__init__()
        self.student = student
        self.teacher = self.freeze(teacher)
        self.temperature = temperature
        self.ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.kl = keras.losses.KLDivergence()
        self.accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        self.add_update("student", tapeworks.StaticWeights(
            {"labels": alpha, "teacher": (1 - alpha) * temperature ** 2}),
            student, keras.optimizers.Adam(3e-3))

    def compute_losses(self, batch, training):
        x, y = batch
        logits = self.student(x, training=training)
        t = self.temperature
        soft_teacher = tf.nn.softmax(self.teacher(x) / t)
        soft_student = tf.nn.softmax(logits / t)
        return ({"labels": self.ce(y, logits), "teacher": self.kl(soft_teacher, soft_student)},
                {"y": y, "logits": logits})

    def update_metrics(self, batch, outputs):
        self.accuracy.update_state(outputs["y"], outputs["logits"])

    def metric_results(self):
        return {"accuracy": self.accuracy.result()}

    def reset_metrics(self):
        self.accuracy.reset_state()


def accuracy(model, x, y):
    return float(np.mean(np.argmax(model(x, training=False).numpy(), -1) == y))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, for tests")
    args = parser.parse_args(argv)
    (x, y), (x_test, y_test) = digits_split()
    epochs = 5 if args.quick else 40
    keras.utils.set_random_seed(0)
    teacher = mlp((256, 256), "teacher")
    tapeworks.Trainer(teacher, keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), seed=0).fit((x, y), batch_size=32, epochs=epochs, verbose=0)
    teacher_weights = [w.copy() for w in teacher.get_weights()]

    keras.utils.set_random_seed(1)
    scratch = mlp((16,), "student_scratch")
    tapeworks.Trainer(scratch, keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), seed=0).fit((x, y), batch_size=32, epochs=epochs, verbose=0)
    keras.utils.set_random_seed(1)
    student = mlp((16,), "student")
    trainer = tapeworks.Trainer(Distillation(student, teacher), seed=0)
    history = trainer.fit((x, y), batch_size=32, epochs=epochs, verbose=0)

    unchanged = all(np.array_equal(a, b) for a, b in zip(teacher.get_weights(), teacher_weights))
    result = {"teacher": accuracy(teacher, x_test, y_test),
              "student_from_scratch": accuracy(scratch, x_test, y_test),
              "student_distilled": accuracy(student, x_test, y_test),
              "teacher_unchanged": unchanged,
              "final_losses": {k: history.history[k][-1] for k in ("labels", "teacher")}}
    print("held-out accuracy: teacher {teacher:.3f}, student from scratch "
          "{student_from_scratch:.3f}, distilled student {student_distilled:.3f}; teacher "
          "weights unchanged: {teacher_unchanged}".format(**result))
    return result


if __name__ == "__main__":
    main()
