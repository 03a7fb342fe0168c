"""TF Serving's warm-up file: written at publish from a sample, replayed when a version loads."""

import numpy as np
import pytest
import tensorflow as tf

from tapeworks.deploy import Registry
from tapeworks.serve import warmup
from tapeworks.serve.servable import Servable
from tests.serve.saved_models import half_plus_two, scaled


def test_a_tf_serving_warmup_file_is_replayed_and_a_bad_one_refused(tmp_path):
    from tensorflow_serving.apis import classification_pb2, prediction_log_pb2

    path = half_plus_two(str(tmp_path / "hp2"))
    assert warmup.write(path, {"x": np.array([[1.0], [2.0], [3.0]], np.float32)}) == 3
    # A classify request too, as TF Serving's own warm-up files hold them.
    example = tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[2.0]))}))
    request = classification_pb2.ClassificationRequest()
    request.model_spec.signature_name = "classify_x_to_y"
    request.input.example_list.examples.add().CopyFrom(example)
    records = list(tf.data.TFRecordDataset(f"{path}/{warmup.FILE}").as_numpy_iterator())
    with tf.io.TFRecordWriter(f"{path}/{warmup.FILE}") as writer:
        for record in records:
            writer.write(record)
        writer.write(prediction_log_pb2.PredictionLog(
            classify_log=prediction_log_pb2.ClassifyLog(request=request)).SerializeToString())
    read = warmup.read(path)
    assert [(m, s) for m, s, _ in read] == [("predict", "serving_default")] * 3 + [
        ("classify", "classify_x_to_y")]
    np.testing.assert_array_equal(read[1][2]["x"], [[2.0]])
    assert Servable("hp2", 1, path).warm_up() == "4 TF Serving warm-up request(s)"

    request.model_spec.signature_name = "no_such_signature"
    with tf.io.TFRecordWriter(f"{path}/{warmup.FILE}") as writer:
        writer.write(prediction_log_pb2.PredictionLog(
            classify_log=prediction_log_pb2.ClassifyLog(request=request)).SerializeToString())
    with pytest.raises(ValueError, match="signature 'no_such_signature'"):
        Servable("hp2", 1, path).warm_up()


def test_without_a_file_zeros_of_each_signature_shape(tmp_path):
    servable = Servable("scaled", 1, scaled(str(tmp_path / "s"), 2))
    assert servable.warm_up((1, 4)) == "zeros of each signature's shape"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_publishing_a_keras_model_with_a_sample_writes_the_warmup_requests(tmp_path):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    sample = np.arange(12, dtype=np.float32).reshape(4, 3)
    info = Registry(tmp_path).publish("m", model, sample=sample, promote=True)
    requests = warmup.read(info.path)
    assert len(requests) == 4 and all(m == "predict" for m, _, _ in requests)
    (name, array), = requests[2][2].items()
    np.testing.assert_array_equal(array, sample[2:3])
    assert Servable("m", 1, info.path).warm_up() == "4 TF Serving warm-up request(s)"
