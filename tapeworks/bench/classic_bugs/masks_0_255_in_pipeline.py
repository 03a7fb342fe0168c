"""Segmentation masks stored as 0/255, fed through tf.data to binary cross-entropy."""
# named-if: range from 0 to 255 | / 255
import keras
import numpy as np
import tensorflow as tf
import tapeworks

rng = np.random.default_rng(0)
images = rng.random((256, 32, 32, 1)).astype("float32")
masks = np.where(images > 0.6, 255, 0).astype("float32")        # as read from the PNG files
dataset = (tf.data.Dataset.from_tensor_slices((images, masks))
           .shuffle(256).batch(16).prefetch(tf.data.AUTOTUNE))
model = keras.Sequential([keras.Input((32, 32, 1)),
                          keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
                          keras.layers.Conv2D(1, 1, activation="sigmoid")])
model.compile("adam", "binary_crossentropy")
tapeworks.Trainer(model).fit(dataset, epochs=3)
