# Source: tensorflow/docs, site/en/tutorials/images/classification.ipynb (code cells), commit
# 7c3650212740204359d4ceae481abc79345541be (2026-03-11). Licence: Apache-2.0 (Copyright 2018 The
# TensorFlow Authors).
# Changed, and nothing else: the downloaded flower_photos folders -> folders of the same layout
# (daisy, dandelion, roses, sunflowers, tulips; JPEG files) in a temporary folder, holding
# size(48, 12) random 240x320 RGB JPEGs a class (seeded by corpus_fit), read by the
# tutorial's own image_dataset_from_directory calls (which resize to 180x180); epochs 15 ->
# size(2, 1); of the tutorial's two fits, the one kept is the second (the data-augmentation
# layers RandomFlip/RandomRotation/RandomZoom, Rescaling, Dropout), the first model and fit,
# the image previews (PIL, matplotlib), the prediction on a downloaded sunflower and the
# TFLite conversion removed; model.fit(...) -> corpus_fit.fit(model, ...) with the same
# arguments (the switch: see corpus_fit.py); corpus_fit.report(history) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import os
import tempfile

import numpy as np
import tensorflow as tf

from tensorflow import keras
from tensorflow.keras import layers
from tensorflow.keras.models import Sequential

import pathlib

# The download's stand-in: one folder of JPEGs a class.
rng = np.random.default_rng(0)
data_dir = pathlib.Path(tempfile.mkdtemp()) / "flower_photos"
for flower in ("daisy", "dandelion", "roses", "sunflowers", "tulips"):
  os.makedirs(data_dir / flower)
  for i in range(corpus_fit.size(48, 12)):
    pixels = rng.integers(0, 256, (240, 320, 3), dtype="uint8")
    tf.io.write_file(str(data_dir / flower / f"{i}.jpg"), tf.io.encode_jpeg(pixels))

image_count = len(list(data_dir.glob('*/*.jpg')))
print(image_count)

batch_size = 32
img_height = 180
img_width = 180

train_ds = tf.keras.utils.image_dataset_from_directory(
  data_dir,
  validation_split=0.2,
  subset="training",
  seed=123,
  image_size=(img_height, img_width),
  batch_size=batch_size)

val_ds = tf.keras.utils.image_dataset_from_directory(
  data_dir,
  validation_split=0.2,
  subset="validation",
  seed=123,
  image_size=(img_height, img_width),
  batch_size=batch_size)

class_names = train_ds.class_names
print(class_names)

AUTOTUNE = tf.data.AUTOTUNE

train_ds = train_ds.cache().shuffle(1000).prefetch(buffer_size=AUTOTUNE)
val_ds = val_ds.cache().prefetch(buffer_size=AUTOTUNE)

num_classes = len(class_names)

data_augmentation = keras.Sequential(
  [
    layers.RandomFlip("horizontal",
                      input_shape=(img_height,
                                  img_width,
                                  3)),
    layers.RandomRotation(0.1),
    layers.RandomZoom(0.1),
  ]
)

model = Sequential([
  data_augmentation,
  layers.Rescaling(1./255),
  layers.Conv2D(16, 3, padding='same', activation='relu'),
  layers.MaxPooling2D(),
  layers.Conv2D(32, 3, padding='same', activation='relu'),
  layers.MaxPooling2D(),
  layers.Conv2D(64, 3, padding='same', activation='relu'),
  layers.MaxPooling2D(),
  layers.Dropout(0.2),
  layers.Flatten(),
  layers.Dense(128, activation='relu'),
  layers.Dense(num_classes, name="outputs")
])

model.compile(optimizer='adam',
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=['accuracy'])

model.summary()

epochs = corpus_fit.size(2, 1)
history = corpus_fit.fit(
  model,
  train_ds,
  validation_data=val_ds,
  epochs=epochs
)

corpus_fit.report(history)
