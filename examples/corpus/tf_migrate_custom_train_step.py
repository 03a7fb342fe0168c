# Source: tensorflow/docs, site/en/guide/migrate/migrating_estimator.ipynb (code cells 5, 6,
# 21-25: "TensorFlow 2: Customize the training step"), commit
# 7c3650212740204359d4ceae481abc79345541be (2026-03-11). Licence: Apache-2.0 (Copyright 2021 The
# TensorFlow Authors). Taken from the guide's migration pages, not site/en/tutorials: no
# tutorial there overrides `train_step` and trains with `fit` without a package this
# environment lacks (tensorflow_compression).
# Changed, and nothing else: the 3 hand-written feature/label rows -> size(2048, 64) rows of the
# same shapes (2 float features, 1 float label; seeded by corpus_fit), so the fit runs long
# enough to time; `import tensorflow.compat.v1 as tf1` and the Estimator cells dropped (the
# TF1 half of the comparison); model.fit(dataset) -> corpus_fit.fit(model, dataset) (the
# switch: see corpus_fit.py), the evaluate cell after it removed; corpus_fit.report(history)
# at the end. The tutorial's fit runs one epoch (the default), kept.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import numpy as np
import tensorflow as tf

rng = np.random.default_rng(0)
features = rng.uniform(1., 6.5, (corpus_fit.size(2048, 64), 2)).tolist()
labels = rng.uniform(0.3, 1., (corpus_fit.size(2048, 64), 1)).tolist()
eval_features = [[4., 4.5], [5., 5.5], [6., 6.5]]
eval_labels = [[0.8], [0.9], [1.]]

class CustomModel(tf.keras.Sequential):
  """A custom sequential model that overrides `Model.train_step`."""

  def train_step(self, data):
    batch_data, labels = data

    with tf.GradientTape() as tape:
      predictions = self(batch_data, training=True)
      # Compute the loss value (the loss function is configured
      # in `Model.compile`).
      loss = self.compiled_loss(labels, predictions)

    # Compute the gradients of the parameters with respect to the loss.
    gradients = tape.gradient(loss, self.trainable_variables)
    # Perform gradient descent by updating the weights/parameters.
    self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
    # Update the metrics (includes the metric that tracks the loss).
    self.compiled_metrics.update_state(labels, predictions)
    # Return a dict mapping metric names to the current values.
    return {m.name: m.result() for m in self.metrics}

dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(1)
eval_dataset = tf.data.Dataset.from_tensor_slices(
      (eval_features, eval_labels)).batch(1)

model = CustomModel([tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.Adagrad(learning_rate=0.05)

model.compile(optimizer=optimizer, loss="mse")

history = corpus_fit.fit(model, dataset)

corpus_fit.report(history)
