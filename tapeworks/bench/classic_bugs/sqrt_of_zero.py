"""An RMSE loss written as sqrt(mean squared error): its gradient at a perfect fit is 0/0."""
# named-if: NonFiniteError | gradient
import keras
import numpy as np
import tensorflow as tf
import tapeworks

x = np.zeros((64, 4), "float32")
y = np.zeros((64, 1), "float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="zeros")])


def rmse(y_true, y_pred):
    return tf.sqrt(tf.reduce_mean(tf.square(y_true - y_pred)))


tapeworks.Trainer(model, "adam", rmse).fit(x, y, batch_size=16, epochs=1)
