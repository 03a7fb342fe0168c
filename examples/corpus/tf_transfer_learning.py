# Source: tensorflow/docs, site/en/tutorials/images/transfer_learning.ipynb (code cells),
# commit 7c3650212740204359d4ceae481abc79345541be (2026-03-11). Licence: Apache-2.0 (Copyright
# 2019 The TensorFlow Authors; the notebook also carries an MIT notice, Copyright (c) 2017
# François Chollet).
# Changed, and nothing else: the downloaded cats_and_dogs_filtered.zip -> folders of the same
# layout (train/{cats,dogs}, validation/{cats,dogs}, one JPEG a file, RGB, 100-240 pixels a side)
# in a temporary folder, holding size(96, 32) training and size(64, 32) validation images
# (seeded by corpus_fit), read by the tutorial's own image_dataset_from_directory calls;
# MobileNetV2(weights='imagenet') -> weights=None (same architecture, randomly initialised: no
# download here); initial_epochs 10 -> size(2, 1) and fine_tune_epochs 10 -> size(2, 1);
# matplotlib (import, the sample/augmentation/learning-curve plots and the history lists kept
# only for them) and tf.keras.utils.plot_model (needs pydot) removed; the cells after the second
# fit (test evaluate, predictions) removed; both model.fit(...) calls -> corpus_fit.fit(model,
# ...) with the same arguments (the switch: see corpus_fit.py); corpus_fit.report(history_fine)
# at the end. Both fits are kept: the frozen base, then the top layers of the base unfrozen
# (fine_tune_at = 100) and recompiled with a 10x lower learning rate, initial_epoch from the
# first history.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import numpy as np
import os
import tensorflow as tf

import tempfile

# The downloaded folder's stand-in (see the header).
rng = np.random.default_rng(0)
PATH = os.path.join(tempfile.mkdtemp(), 'cats_and_dogs_filtered')
for subset, count in (('train', corpus_fit.size(96, 32)), ('validation', corpus_fit.size(64, 32))):
  for label in ('cats', 'dogs'):
    os.makedirs(os.path.join(PATH, subset, label))
    for i in range(count // 2):
      height, width = rng.integers(100, 241, 2)
      image = rng.integers(0, 256, (height, width, 3), dtype='uint8')
      tf.io.write_file(os.path.join(PATH, subset, label, f'{label[:-1]}.{i}.jpg'),
                       tf.io.encode_jpeg(image))

train_dir = os.path.join(PATH, 'train')
validation_dir = os.path.join(PATH, 'validation')

BATCH_SIZE = 32
IMG_SIZE = (160, 160)

train_dataset = tf.keras.utils.image_dataset_from_directory(train_dir,
                                                            shuffle=True,
                                                            batch_size=BATCH_SIZE,
                                                            image_size=IMG_SIZE)

validation_dataset = tf.keras.utils.image_dataset_from_directory(validation_dir,
                                                                 shuffle=True,
                                                                 batch_size=BATCH_SIZE,
                                                                 image_size=IMG_SIZE)

val_batches = tf.data.experimental.cardinality(validation_dataset)
test_dataset = validation_dataset.take(val_batches // 5)
validation_dataset = validation_dataset.skip(val_batches // 5)

print('Number of validation batches: %d' % tf.data.experimental.cardinality(validation_dataset))
print('Number of test batches: %d' % tf.data.experimental.cardinality(test_dataset))

AUTOTUNE = tf.data.AUTOTUNE

train_dataset = train_dataset.prefetch(buffer_size=AUTOTUNE)
validation_dataset = validation_dataset.prefetch(buffer_size=AUTOTUNE)
test_dataset = test_dataset.prefetch(buffer_size=AUTOTUNE)

data_augmentation = tf.keras.Sequential([
  tf.keras.layers.RandomFlip('horizontal'),
  tf.keras.layers.RandomRotation(0.2),
])

preprocess_input = tf.keras.applications.mobilenet_v2.preprocess_input

rescale = tf.keras.layers.Rescaling(1./127.5, offset=-1)

# Create the base model from the pre-trained model MobileNet V2
IMG_SHAPE = IMG_SIZE + (3,)
base_model = tf.keras.applications.MobileNetV2(input_shape=IMG_SHAPE,
                                               include_top=False,
                                               weights=None)

image_batch, label_batch = next(iter(train_dataset))
feature_batch = base_model(image_batch)
print(feature_batch.shape)

base_model.trainable = False

# Let's take a look at the base model architecture
base_model.summary()

global_average_layer = tf.keras.layers.GlobalAveragePooling2D()
feature_batch_average = global_average_layer(feature_batch)
print(feature_batch_average.shape)

prediction_layer = tf.keras.layers.Dense(1, activation='sigmoid')
prediction_batch = prediction_layer(feature_batch_average)
print(prediction_batch.shape)

inputs = tf.keras.Input(shape=(160, 160, 3))
x = data_augmentation(inputs)
x = preprocess_input(x)
x = base_model(x, training=False)
x = global_average_layer(x)
x = tf.keras.layers.Dropout(0.2)(x)
outputs = prediction_layer(x)
model = tf.keras.Model(inputs, outputs)

model.summary()

len(model.trainable_variables)

base_learning_rate = 0.0001
model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=base_learning_rate),
              loss=tf.keras.losses.BinaryCrossentropy(),
              metrics=[tf.keras.metrics.BinaryAccuracy(threshold=0.5, name='accuracy')])

initial_epochs = corpus_fit.size(2, 1)

loss0, accuracy0 = model.evaluate(validation_dataset)

print("initial loss: {:.2f}".format(loss0))
print("initial accuracy: {:.2f}".format(accuracy0))

history = corpus_fit.fit(model, train_dataset,
                    epochs=initial_epochs,
                    validation_data=validation_dataset)

base_model.trainable = True

# Let's take a look to see how many layers are in the base model
print("Number of layers in the base model: ", len(base_model.layers))

# Fine-tune from this layer onwards
fine_tune_at = 100

# Freeze all the layers before the `fine_tune_at` layer
for layer in base_model.layers[:fine_tune_at]:
  layer.trainable = False

model.compile(loss=tf.keras.losses.BinaryCrossentropy(),
              optimizer = tf.keras.optimizers.RMSprop(learning_rate=base_learning_rate/10),
              metrics=[tf.keras.metrics.BinaryAccuracy(threshold=0.5, name='accuracy')])

model.summary()

len(model.trainable_variables)

fine_tune_epochs = corpus_fit.size(2, 1)
total_epochs =  initial_epochs + fine_tune_epochs

history_fine = corpus_fit.fit(model, train_dataset,
                         epochs=total_epochs,
                         initial_epoch=len(history.epoch),
                         validation_data=validation_dataset)

corpus_fit.report(history_fine)
