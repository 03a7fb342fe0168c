"""SavedModels the serving tests load: built here, nothing downloaded.

`half_plus_two` rebuilds TensorFlow Serving's own test model
(`servables/tensorflow/testdata/saved_model_half_plus_two.py`, its TF1 branch)
with `tf.compat.v1`: a graph that parses tf.Examples, y = 0.5 x + 2, and the
signatures TF Serving's REST tests call (`serving_default` predict x -> y with
tensors named `x:0`/`y:0`, `classify_x_to_y`, `regress_x_to_y`,
`regress_x_to_y2`, `regress_x2_to_y3`), whose metadata must equal TF Serving's
fixture (copied from its repository, Apache 2.0). `scaled` is a TF2 module, y = k x + 2
over [None, 3], with a second signature of two inputs and two outputs.
"""

import tensorflow as tf


def half_plus_two(path, a=0.5, b=2.0):
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as session:
        va, vb, vc = v1.Variable(a, name="a"), v1.Variable(b, name="b"), v1.Variable(3.0, name="c")
        # No shape: the model TF Serving checks in (and its metadata fixture,
        # tf_serving_half_plus_two_metadata.json) was built before the script
        # gave this placeholder shape=[None]; the TensorFlow of then still
        # inferred [-1, 1] for the parsed features, which the reshape restores.
        serialized = v1.placeholder(tf.string, name="tf_example")
        example = v1.parse_example(tf.reshape(serialized, [-1]), {
            "x": v1.FixedLenFeature([1], dtype=tf.float32),
            "x2": v1.FixedLenFeature([1], dtype=tf.float32, default_value=[0.0])})
        x = tf.identity(example["x"], name="x")
        y = tf.identity(tf.add(tf.multiply(va, x), vb), name="y")
        y2 = tf.identity(tf.add(tf.multiply(va, x), vc), name="y2")
        x2 = tf.identity(example["x2"], name="x2")
        a2, c2 = v1.Variable(0.5, name="a2"), v1.Variable(3.0, name="c2")
        y3 = tf.identity(tf.add(tf.multiply(a2, x2), c2), name="y3")
        info = v1.saved_model.utils.build_tensor_info
        build = v1.saved_model.signature_def_utils.build_signature_def
        consts = v1.saved_model.signature_constants
        signatures = {
            "regress_x_to_y": build({"inputs": info(serialized)}, {"outputs": info(y)},
                                    consts.REGRESS_METHOD_NAME),
            "regress_x_to_y2": build({"inputs": info(serialized)}, {"outputs": info(y2)},
                                     consts.REGRESS_METHOD_NAME),
            "regress_x2_to_y3": build({"inputs": info(x2)}, {"outputs": info(y3)},
                                      consts.REGRESS_METHOD_NAME),
            "classify_x_to_y": build({"inputs": info(serialized)}, {"scores": info(y)},
                                     consts.CLASSIFY_METHOD_NAME),
            "serving_default": build({"x": info(x)}, {"y": info(y)}, consts.PREDICT_METHOD_NAME),
        }
        session.run(v1.global_variables_initializer())
        builder = v1.saved_model.Builder(path)
        builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map=signatures)
        builder.save()
    return path


class Scaled(tf.Module):
    def __init__(self, k):
        super().__init__()
        self.k = tf.Variable(float(k))

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def serve(self, x):
        return {"y": x * self.k + 2.0}

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="a"),
                                  tf.TensorSpec([None], tf.string, name="tag")])
    def two(self, a, tag):
        return {"total": tf.reduce_sum(a, axis=1) * self.k,
                "tag_bytes": tf.strings.join([tag, tf.constant(b"\x00!")])}


def scaled(path, k):
    module = Scaled(k)
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve,
                                                  "two": module.two})
    return path
