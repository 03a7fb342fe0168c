# Source: tensorflow/docs, site/en/tutorials/keras/overfit_and_underfit.ipynb (code cells),
# commit 7c3650212740204359d4ceae481abc79345541be (2026-03-11). Licence: Apache-2.0 (Copyright
# 2018 The TensorFlow Authors).
# Changed, and nothing else: the downloaded HIGGS.csv.gz -> a gzip CSV of the same layout (a
# 0/1 label then 28 float features a row), size(6000, 1500) rows (seeded by corpus_fit),
# written to a temporary folder and read by the tutorial's own CsvDataset pipeline;
# N_VALIDATION 1e3 -> size(1000, 500), N_TRAIN 1e4 -> size(5000, 1000); max_epochs 10000 ->
# size(4, 1); tfdocs.modeling.EpochDots() dropped from the callbacks (tensorflow_docs is not
# installed here; it only prints dots); of the tutorial's models, the one kept is `l2_model`
# (L2 kernel regularizers: the layers' add_loss losses), the other models, the histogram and
# all plotting removed; model.fit(...) in compile_and_fit -> corpus_fit.fit(model, ...) with the
# same arguments (the switch: see corpus_fit.py); corpus_fit.report(history) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import gzip
import os

import tensorflow as tf

from tensorflow.keras import layers
from tensorflow.keras import regularizers

print(tf.__version__)

import numpy as np

import pathlib
import shutil
import tempfile

logdir = pathlib.Path(tempfile.mkdtemp())/"tensorboard_logs"
shutil.rmtree(logdir, ignore_errors=True)

# The download's stand-in: label, then 28 features, comma separated, gzip.
rng = np.random.default_rng(0)
gz = os.path.join(tempfile.mkdtemp(), 'HIGGS.csv.gz')
rows = np.concatenate([rng.integers(0, 2, (corpus_fit.size(6000, 1500), 1)),
                       rng.normal(size=(corpus_fit.size(6000, 1500), 28))], axis=1)
with gzip.open(gz, "wt") as f:
  np.savetxt(f, rows, fmt="%.6e", delimiter=",")

FEATURES = 28

ds = tf.data.experimental.CsvDataset(gz,[float(),]*(FEATURES+1), compression_type="GZIP")

def pack_row(*row):
  label = row[0]
  features = tf.stack(row[1:],1)
  return features, label

packed_ds = ds.batch(10000).map(pack_row).unbatch()

N_VALIDATION = corpus_fit.size(1000, 500)
N_TRAIN = corpus_fit.size(5000, 1000)
BUFFER_SIZE = int(1e4)
BATCH_SIZE = 500
STEPS_PER_EPOCH = N_TRAIN//BATCH_SIZE

validate_ds = packed_ds.take(N_VALIDATION).cache()
train_ds = packed_ds.skip(N_VALIDATION).take(N_TRAIN).cache()

validate_ds = validate_ds.batch(BATCH_SIZE)
train_ds = train_ds.shuffle(BUFFER_SIZE).repeat().batch(BATCH_SIZE)

lr_schedule = tf.keras.optimizers.schedules.InverseTimeDecay(
  0.001,
  decay_steps=STEPS_PER_EPOCH*1000,
  decay_rate=1,
  staircase=False)

def get_optimizer():
  return tf.keras.optimizers.Adam(lr_schedule)

def get_callbacks(name):
  return [
    tf.keras.callbacks.EarlyStopping(monitor='val_binary_crossentropy', patience=200),
    tf.keras.callbacks.TensorBoard(logdir/name),
  ]

def compile_and_fit(model, name, optimizer=None, max_epochs=corpus_fit.size(4, 1)):
  if optimizer is None:
    optimizer = get_optimizer()
  model.compile(optimizer=optimizer,
                loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
                metrics=[
                  tf.keras.metrics.BinaryCrossentropy(
                      from_logits=True, name='binary_crossentropy'),
                  'accuracy'])

  model.summary()

  history = corpus_fit.fit(
    model,
    train_ds.map(lambda x, y: (x, tf.expand_dims(y, axis=-1))),
    steps_per_epoch = STEPS_PER_EPOCH,
    epochs=max_epochs,
    validation_data=validate_ds.map(lambda x, y: (x, tf.expand_dims(y, axis=-1))),
    callbacks=get_callbacks(name),
    verbose=0)
  return history

l2_model = tf.keras.Sequential([
    layers.Dense(512, activation='elu',
                 kernel_regularizer=regularizers.l2(0.001),
                 input_shape=(FEATURES,)),
    layers.Dense(512, activation='elu',
                 kernel_regularizer=regularizers.l2(0.001)),
    layers.Dense(512, activation='elu',
                 kernel_regularizer=regularizers.l2(0.001)),
    layers.Dense(512, activation='elu',
                 kernel_regularizer=regularizers.l2(0.001)),
    layers.Dense(1)
])

history = compile_and_fit(l2_model, "regularizers/l2")

corpus_fit.report(history)
