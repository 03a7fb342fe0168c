"""`cond` and `while_loop` for the step: TensorFlow's when traced, plain Python when run eagerly.

TensorFlow's `tf.cond` and `tf.while_loop`, called eagerly, also just run
the branch or loop in Python, but the work run through them was slower: with
`run_eagerly=True`, Adam's update of four weights inside an eager `tf.cond`
took 8.6-8.9 ms a step against 7.1-7.4 ms in a Python `if` (medians of 42-56
steps, the tf_preprocessing_layers corpus script, AMD EPYC, Keras' own eager
update 7.1-7.7 ms). Where the time goes is not pinned down: removing the
"cond" name scope TensorFlow's eager branch opens did not help (8.6 ms),
while calling that same eager branch without `tf.cond`'s API wrappers
(dispatch, deprecated-argument check) did (7.3 ms). Traced (tf.function,
XLA), these are TensorFlow's, unchanged.
"""

import tensorflow as tf


def cond(pred, true_fn, false_fn):
    """`tf.cond(pred, true_fn, false_fn)`; eagerly, the branch `pred`'s value picks."""
    if tf.executing_eagerly():
        return true_fn() if bool(pred) else false_fn()
    return tf.cond(pred, true_fn, false_fn)


def while_loop(keep_going, body, loop_vars):
    """`tf.while_loop(keep_going, body, loop_vars)`; eagerly, a Python `while` on its value."""
    if tf.executing_eagerly():
        loop_vars = tuple(loop_vars)
        while bool(keep_going(*loop_vars)):
            loop_vars = tuple(body(*loop_vars))
        return loop_vars
    return tf.while_loop(keep_going, body, loop_vars)
