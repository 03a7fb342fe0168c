"""The catalogue of lint rules: stable codes, messages, explanations with examples.

The detection logic lives in `checker.py`; this module is what
`tapeworks lint --explain CODE` prints and what every finding refers to.
"""

import dataclasses
import re
import textwrap

from tapeworks.docs_links import docs_anchor


@dataclasses.dataclass(frozen=True)
class Rule:
    code: str
    name: str
    message: str
    why: str
    bad: str
    good: str
    fix: str
    title: str = ""   # for rules whose message is all placeholder: what `--list` shows

    @property
    def summary(self):
        """One line for `--list` and `--explain`: the message, placeholders as `...`."""
        return self.title or re.sub(r"\{\w+\}", "...", self.message)

    def explain(self):
        return "\n".join([
            f"{self.code} ({self.name}): {self.summary}",
            "",
            textwrap.fill(self.why, 78),
            "",
            "Bad:",
            textwrap.indent(textwrap.dedent(self.bad).strip("\n"), "    "),
            "",
            "Good:",
            textwrap.indent(textwrap.dedent(self.good).strip("\n"), "    "),
            "",
            f"Fix: {self.fix}",
            "",
            f"Suppress one line with `# noqa: {self.code}`.",
            f"Documented in the user guide: {docs_anchor(self.code)}.",
        ])


RULES = {rule.code: rule for rule in [
    Rule(
        "TW101", "keras-loop-in-tape",
        "`{call}` inside a GradientTape: it cannot be differentiated",
        "predict(), predict_on_batch() and train_on_batch() run a whole Keras loop of their "
        "own (dataset, iterator, compiled function) and return NumPy; .numpy() leaves the "
        "graph too. Inside a tape the gradient path is cut: you get an `IteratorGetNext` "
        "gradient error, or a None gradient and a model that silently does not learn.",
        """
        with tf.GradientTape() as tape:
            features = critic.predict(generated)
            loss = tf.reduce_mean((features - target) ** 2)
        """,
        """
        with tf.GradientTape() as tape:
            features = critic(generated, training=False)
            loss = tf.reduce_mean((features - target) ** 2)
        """,
        "call the model directly, `model(x, training=False)`, and keep tensors as tensors.",
    ),
    Rule(
        "TW102", "predict-in-training-loop",
        "`{call}` inside a training loop: each call costs a whole inference loop",
        "model.predict() builds a dataset, an iterator and (the first time) a compiled "
        "function, then copies the result to NumPy. Called once per training step it "
        "costs hundreds of times a direct call and, repeated, grows memory.",
        """
        for x, y in dataset:
            fake = generator.predict(noise)
            discriminator.train_on_batch(fake, zeros)
        """,
        """
        for x, y in dataset:
            fake = generator(noise, training=False)
            discriminator.train_on_batch(fake, zeros)
        """,
        "call the model directly inside the loop (`model(x, training=False)`).",
    ),
    Rule(
        "TW103", "print-in-tf-function",
        "`print()` inside a tf.function runs once, while tracing",
        "Python's print is a side effect of tracing: it prints symbolic tensors once when "
        "the function is traced and never again when the graph runs.",
        """
        @tf.function
        def train_step(x):
            loss = step(x)
            print("loss", loss)
        """,
        """
        @tf.function
        def train_step(x):
            loss = step(x)
            tf.print("loss", loss)
        """,
        "use `tf.print(...)`, or return the value and print it outside.",
    ),
    Rule(
        "TW104", "model-call-without-training",
        "`{call}` inside a GradientTape without `training=`",
        "Dropout and BatchNormalization behave differently in training and inference. "
        "Inside a tape the model being trained needs `training=True`, and a frozen helper "
        "(critic, teacher) needs `training=False`; leaving it out relies on a default that "
        "differs between model kinds and Keras versions.",
        """
        with tf.GradientTape() as tape:
            logits = model(x)
        """,
        """
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
        """,
        "pass `training=True` (or `training=False` for a frozen helper model).",
    ),
    Rule(
        "TW105", "persistent-tape-not-deleted",
        "persistent GradientTape `{name}` is {problem}",
        "A persistent tape keeps every intermediate tensor of the forward pass alive until "
        "it is deleted. Never deleted, or created anew in every iteration of a loop without "
        "being deleted there, it holds that memory for as long as the name lives.",
        """
        for x, y in dataset:
            with tf.GradientTape(persistent=True) as tape:
                loss_a, loss_b = losses(x, y)
            ga = tape.gradient(loss_a, a_vars)
            gb = tape.gradient(loss_b, b_vars)
        """,
        """
        for x, y in dataset:
            with tf.GradientTape(persistent=True) as tape:
                loss_a, loss_b = losses(x, y)
            ga = tape.gradient(loss_a, a_vars)
            gb = tape.gradient(loss_b, b_vars)
            del tape
        """,
        "`del tape` once its last gradient is taken (in the same loop body).",
    ),
    Rule(
        "TW106", "concat-in-loop",
        "`{name}` grows by `{call}` inside a loop: quadratic copying",
        "Every concatenation copies everything collected so far, so n iterations copy "
        "O(n^2) elements, and inside tf.function the shape changes every iteration.",
        """
        outputs = tf.zeros((0, 10))
        for batch in batches:
            outputs = tf.concat([outputs, model(batch)], axis=0)
        """,
        """
        outputs = []
        for batch in batches:
            outputs.append(model(batch))
        outputs = tf.concat(outputs, axis=0)
        """,
        "collect the pieces in a list (or a tf.TensorArray in a tf.function) and "
        "concatenate once.",
    ),
    Rule(
        "TW107", "tf-function-retracing",
        "{what}",
        "A tf.function is traced again for every new Python value of a Python argument, and "
        "a tf.function created inside a loop is a new function with an empty trace cache "
        "each time: either way every iteration pays for tracing (and XLA compilation).",
        """
        for step in range(1000):
            train_step(x, step)
        """,
        """
        for step in range(1000):
            train_step(x, tf.constant(step))
        """,
        "pass tensors (`tf.constant(step)`) for values that change, and create each "
        "tf.function once, outside the loop.",
        title="a tf.function retraced every iteration (a Python value argument, or created "
              "in a loop)",
    ),
    Rule(
        "TW108", "trainable-changed-after-compile",
        "`{name}.trainable` changed after `{model}.compile()` and not compiled again",
        "Keras fixes the set of trainable weights when the training function is first "
        "built after compile(). Changing `trainable` afterwards does not take effect for "
        "that model until it is compiled again (Keras 3 warns about it).",
        """
        model.compile("adam", "mse")
        base.trainable = False
        model.fit(x, y)
        """,
        """
        base.trainable = False
        model.compile("adam", "mse")
        model.fit(x, y)
        """,
        "set `trainable` before compile(), or call compile() again after changing it.",
    ),
    Rule(
        "TW109", "tf-data-pipeline",
        "{what}",
        "Shuffling after batching only reorders whole batches: every epoch sees the same "
        "batches. A `.map(fn)` without num_parallel_calls runs one element at a time when "
        "`fn` is stateful (TensorFlow's random ops with hidden state such as "
        "`tf.random.uniform` or `tf.image.random_flip_left_right`, py_function): tf.data "
        "parallelises a stateless map, and adds a final prefetch, by itself, so neither is "
        "reported.",
        """
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.map(lambda x, y: (tf.image.random_flip_left_right(x), y))
        ds = ds.batch(32).shuffle(100)
        """,
        """
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10_000)
        ds = ds.map(lambda x, y: (tf.image.random_flip_left_right(x), y),
                    num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.batch(32).prefetch(tf.data.AUTOTUNE)
        """,
        "shuffle before batch, and `num_parallel_calls=tf.data.AUTOTUNE` on a stateful map "
        "(tapeworks.data.pipeline builds this order).",
        title="a tf.data pipeline out of order: shuffle after batch, a stateful map run "
              "one element at a time",
    ),
    Rule(
        "TW110", "integer-floor-division",
        "`{expr}` floor-divides two integer tensors: a ratio comes out 0 or 1",
        "Both operands were created with an integer dtype, so `//` (or floordiv) gives an "
        "integer: correct / total is 0 until every sample is correct. (In TensorFlow 2, `/` "
        "on integer tensors is true division and returns float64.)",
        """
        correct = tf.reduce_sum(tf.cast(pred == y, tf.int32))
        total = tf.size(y)
        accuracy = correct // total
        """,
        """
        correct = tf.reduce_sum(tf.cast(pred == y, tf.float32))
        total = tf.cast(tf.size(y), tf.float32)
        accuracy = correct / total
        """,
        "cast both sides to float and use `/`.",
    ),
    Rule(
        "TW111", "float16-without-loss-scaling",
        "mixed_float16 policy with a custom GradientTape loop but no loss scaling",
        "float16 gradients underflow to zero without loss scaling. `model.fit` adds a "
        "LossScaleOptimizer by itself; a hand-written GradientTape loop does not, and "
        "Keras 3 removed `get_scaled_loss`/`get_unscaled_gradients`.",
        """
        keras.mixed_precision.set_global_policy("mixed_float16")
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        """,
        """
        keras.mixed_precision.set_global_policy("mixed_float16")
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            scaled = optimizer.scale_loss(loss)
        optimizer.apply_gradients(zip(tape.gradient(scaled, model.trainable_variables),
                                      model.trainable_variables))
        """,
        "wrap the optimizer in `keras.optimizers.LossScaleOptimizer` and differentiate "
        "`optimizer.scale_loss(loss)`, or use `tapeworks.Trainer(precision=\"mixed_float16\")`.",
    ),
    Rule(
        "TW112", "trainable-model-in-inference-mode",
        "`{name}` is called with training=False but never frozen: its weights are still "
        "trained",
        "`model(x, training=False)` is how a pretrained feature extractor is meant to be "
        "used, but it does not stop the optimizer: unless the model's `trainable` is set to "
        "False (or tapeworks' `Task.freeze` wraps it), every weight in it is updated. (And "
        "in a Functional model, Keras 3 passes the outer call's training=True down over a "
        "training=False given when the model was built, so even BatchNormalization trains "
        "there.) Keras' transfer-learning guide freezes the base model first; a file that "
        "fine-tunes later also sets `trainable = False` somewhere, which silences this rule.",
        """
        base = keras.applications.MobileNetV2(include_top=False)
        features = base(inputs, training=False)
        model = keras.Model(inputs, keras.layers.Dense(10)(features))
        """,
        """
        base = keras.applications.MobileNetV2(include_top=False)
        base.trainable = False
        features = base(inputs, training=False)
        model = keras.Model(inputs, keras.layers.Dense(10)(features))
        """,
        "set `base.trainable = False` before building and compiling (or `Task.freeze` it); "
        "tapeworks' Trainer warns about the same at run time.",
        title="a model called with training=False but never frozen (its weights still train)",
    ),
    Rule(
        "TW113", "random-at-trace-time",
        "`{call}` in {where} is drawn once, while tracing: every {unit} gets the same value",
        "TensorFlow runs a function passed to `Dataset.map`, a tf.function, a Keras "
        "`train_step` or a Task's `compute_losses` once as Python, to build a graph. A "
        "NumPy or Python random number drawn there is drawn once and becomes a constant of "
        "that graph: every element gets the same \"random\" crop, flip or noise, and "
        "augmentation silently does nothing. TensorFlow's own random ops draw anew on every "
        "run.",
        """
        def augment(image, label):
            if np.random.rand() < 0.5:
                image = tf.image.flip_left_right(image)
            return image, label

        dataset = dataset.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        """,
        """
        def augment(image, label):
            image = tf.image.stateless_random_flip_left_right(image, seed=(1, 2))
            return image, label

        dataset = dataset.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        """,
        "draw with TensorFlow: `tf.random.uniform(...)`, `tf.random.stateless_uniform(shape, "
        "seed)` (with a seed per element, e.g. from `Dataset.enumerate`), "
        "`keras.random.uniform(shape, seed=self.seed_generator)` in a layer or model, or "
        "a Task's `self.random.uniform(...)`; or wrap the NumPy code in "
        "`tf.numpy_function`, which runs it per element.",
        title="NumPy's or Python's random inside Dataset.map, a tf.function or a train step "
              "(drawn once, at trace time)",
    ),
]}

PARSE_ERROR = "TW000"
