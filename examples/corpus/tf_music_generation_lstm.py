# Source: tensorflow/docs, site/en/tutorials/audio/music_generation.ipynb (code cells), commit
# 7c3650212740204359d4ceae481abc79345541be (2026-03-11). Licence: Apache-2.0 (Copyright 2021 The
# TensorFlow Authors).
# Changed, and nothing else: the MAESTRO MIDI files parsed with pretty_midi into a DataFrame of
# notes -> the `train_notes` array it gives (pitch 0-127, step and duration in seconds, float64,
# one note a row), size(3000, 600) notes (seeded by corpus_fit); epochs 50 -> size(2, 1); the
# MIDI download, parsing, playback, plots and the cells after the fit (generation) removed, and
# the two display-only evaluate cells before it; ModelCheckpoint's filepath
# './training_checkpoints/ckpt_{epoch}' -> './training_checkpoints/ckpt_{epoch}.weights.h5'
# (Keras 3 refuses save_weights_only=True to any other name, in either fit); model.fit(...) ->
# corpus_fit.fit(model, ...) with the same arguments (the switch: see corpus_fit.py);
# corpus_fit.report(history) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import numpy as np
import tensorflow as tf

key_order = ['pitch', 'step', 'duration']

# The parsed notes' stand-in (np.stack of the DataFrame's three columns in the tutorial).
rng = np.random.default_rng(0)
n_notes = corpus_fit.size(3000, 600)
train_notes = np.stack([rng.integers(21, 109, n_notes).astype("float64"),
                        rng.exponential(0.15, n_notes), rng.exponential(0.3, n_notes)], axis=1)

notes_ds = tf.data.Dataset.from_tensor_slices(train_notes)

def create_sequences(
    dataset: tf.data.Dataset, 
    seq_length: int,
    vocab_size = 128,
) -> tf.data.Dataset:
  """Returns TF Dataset of sequence and label examples."""
  seq_length = seq_length+1

  # Take 1 extra for the labels
  windows = dataset.window(seq_length, shift=1, stride=1,
                              drop_remainder=True)

  # `flat_map` flattens the" dataset of datasets" into a dataset of tensors
  flatten = lambda x: x.batch(seq_length, drop_remainder=True)
  sequences = windows.flat_map(flatten)
  
  # Normalize note pitch
  def scale_pitch(x):
    x = x/[vocab_size,1.0,1.0]
    return x

  # Split the labels
  def split_labels(sequences):
    inputs = sequences[:-1]
    labels_dense = sequences[-1]
    labels = {key:labels_dense[i] for i,key in enumerate(key_order)}

    return scale_pitch(inputs), labels

  return sequences.map(split_labels, num_parallel_calls=tf.data.AUTOTUNE)

seq_length = 25
vocab_size = 128
seq_ds = create_sequences(notes_ds, seq_length, vocab_size)

batch_size = 64
buffer_size = n_notes - seq_length  # the number of items in the dataset
train_ds = (seq_ds
            .shuffle(buffer_size)
            .batch(batch_size, drop_remainder=True)
            .cache()
            .prefetch(tf.data.experimental.AUTOTUNE))

def mse_with_positive_pressure(y_true: tf.Tensor, y_pred: tf.Tensor):
  mse = (y_true - y_pred) ** 2
  positive_pressure = 10 * tf.maximum(-y_pred, 0.0)
  return tf.reduce_mean(mse + positive_pressure)

input_shape = (seq_length, 3)
learning_rate = 0.005

inputs = tf.keras.Input(input_shape)
x = tf.keras.layers.LSTM(128)(inputs)

outputs = {
  'pitch': tf.keras.layers.Dense(128, name='pitch')(x),
  'step': tf.keras.layers.Dense(1, name='step')(x),
  'duration': tf.keras.layers.Dense(1, name='duration')(x),
}

model = tf.keras.Model(inputs, outputs)

loss = {
      'pitch': tf.keras.losses.SparseCategoricalCrossentropy(
          from_logits=True),
      'step': mse_with_positive_pressure,
      'duration': mse_with_positive_pressure,
}

optimizer = tf.keras.optimizers.Adam(learning_rate=learning_rate)

model.compile(loss=loss, optimizer=optimizer)

model.summary()

model.compile(
    loss=loss,
    loss_weights={
        'pitch': 0.05,
        'step': 1.0,
        'duration':1.0,
    },
    optimizer=optimizer,
)

callbacks = [
    tf.keras.callbacks.ModelCheckpoint(
        filepath='./training_checkpoints/ckpt_{epoch}.weights.h5',
        save_weights_only=True),
    tf.keras.callbacks.EarlyStopping(
        monitor='loss',
        patience=5,
        verbose=1,
        restore_best_weights=True),
]

epochs = corpus_fit.size(2, 1)

history = corpus_fit.fit(
    model,
    train_ds,
    epochs=epochs,
    callbacks=callbacks,
)

corpus_fit.report(history)
