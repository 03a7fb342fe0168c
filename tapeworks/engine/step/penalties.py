"""Loss terms that need gradients of their own, inside the step's tape."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf


def gradient_penalty(critic: Callable[..., tf.Tensor], real: tf.Tensor, fake: tf.Tensor,
                     target_norm: float = 1.0) -> tf.Tensor:
    """WGAN-GP's penalty (Gulrajani et al., 2017): E[(||grad_x critic(x)|| - 1)^2].

    `x` are random interpolates of real and fake samples. The inner tape is
    nested in the step's own tape, so the penalty is differentiated again for
    the critic's update (a second-order gradient).
    """
    shape = tf.shape(real)
    alpha = tf.random.uniform(tf.concat([shape[:1], tf.ones_like(shape[1:])], 0), 0.0, 1.0,
                              dtype=real.dtype)
    mixed = real + alpha * (tf.cast(fake, real.dtype) - real)
    with tf.GradientTape() as inner:
        inner.watch(mixed)
        scores = critic(mixed, training=True)
    grads = inner.gradient(scores, mixed)
    axes = tf.range(1, tf.rank(grads))
    norms = tf.sqrt(tf.reduce_sum(tf.square(grads), axis=axes) + 1e-12)
    return tf.reduce_mean(tf.square(norms - target_norm))
