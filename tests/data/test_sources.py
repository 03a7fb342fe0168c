"""Sources: TFRecord round trip and corrupted files, generators, image folders."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks import data


def records(tmp_path, n=20, shards=3):
    rng = np.random.default_rng(0)
    features = {"image": rng.normal(size=(n, 4, 4)).astype("float32"),
                "label": np.arange(n) % 3,
                "name": np.array([f"item{i}".encode() for i in range(n)])}
    files, spec = data.write_tfrecords(str(tmp_path / "part"), features, shards=shards)
    return features, files, spec


def test_tfrecord_round_trip(tmp_path):
    features, files, spec = records(tmp_path)
    assert len(files) == 3 and all(f.endswith(".tfrecord") for f in files)
    read = list(data.tfrecord_source(files, spec))
    assert len(read) == 20
    by_name = {r["name"].numpy(): r for r in read}
    for i in range(20):
        example = by_name[f"item{i}".encode()]
        np.testing.assert_array_equal(example["image"].numpy(), features["image"][i])
        assert int(example["label"]) == i % 3
    assert data.tfrecord_source(str(tmp_path / "part-*.tfrecord"), spec).cardinality() != 0


def corrupt(path, offset=60):
    raw = bytearray(open(path, "rb").read())
    raw[offset] ^= 0xFF
    open(path, "wb").write(bytes(raw))


def _trainer():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(3)])
    return tapeworks.Trainer(model, "sgd", keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), jit_compile=False, steps_per_call=1)


def _training_pipeline(files, spec, **kwargs):
    source = data.tfrecord_source(files, spec, **kwargs).map(
        lambda r: (tf.reshape(r["image"], (16,)), r["label"]))
    return data.pipeline(source, batch_size=2, training=False)


def test_corrupted_file_error_names_file_and_record(tmp_path):
    _, files, spec = records(tmp_path)
    corrupt(files[1])
    assert data.locate_corruption(files) == {
        files[1]: {"record": 0, "error": data.locate_corruption([files[1]])[files[1]]["error"]}}
    with pytest.raises(tapeworks.DataSpecError) as info:
        _trainer().fit(_training_pipeline(files, spec), verbose=0)
    message = str(info.value)
    assert files[1] in message and "record 0" in message and "skip_corrupt=True" in message


def test_truncated_file_is_located(tmp_path):
    _, files, spec = records(tmp_path, shards=1)
    raw = open(files[0], "rb").read()
    open(files[0], "wb").write(raw[:-7])
    (problem,) = data.locate_corruption(files).values()
    assert problem["record"] == 19 and "truncated" in problem["error"]


def test_skip_corrupt_trains_and_counts(tmp_path):
    _, files, spec = records(tmp_path)
    corrupt(files[1])
    history = _trainer().fit(_training_pipeline(files, spec, skip_corrupt=True), verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert list(data.tfrecord_source.last_skipped) == [files[1]]


def test_generator_source():
    def make():
        for i in range(10):
            yield np.full(3, i, "float32"), np.float32(i)

    source = data.generator_source(make, (tf.TensorSpec((3,), tf.float32),
                                          tf.TensorSpec((), tf.float32)))
    built = data.pipeline(source, batch_size=4, training=False)
    assert [b[0].shape[0] for b in built] == [4, 4, 2]
    assert [b[0].shape[0] for b in built] == [4, 4, 2]  # a fresh generator every epoch
    with pytest.raises(tapeworks.ConfigError, match="function returning a generator"):
        data.generator_source(make(), None)


def test_image_folder_source(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in ("cats", "dogs"):
        (tmp_path / label).mkdir()
        for i in range(3):
            pixels = rng.integers(0, 255, (10, 12, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / label / f"{i}.png")
    source, classes = data.image_folder_source(str(tmp_path), image_size=(8, 8))
    assert classes == ["cats", "dogs"]
    built = data.pipeline(source, batch_size=2, training=True, seed=0,
                          map=lambda x, y: (x / 255.0, y))
    images, labels = next(iter(built))
    assert images.shape == (2, 8, 8, 3) and labels.dtype == tf.int32
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(2)])
    trainer = tapeworks.Trainer(model, "adam", keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), jit_compile=False)
    assert np.isfinite(trainer.fit(built, epochs=2, verbose=0).history["loss"][-1])
    with pytest.raises(tapeworks.ConfigError, match="No such folder"):
        data.image_folder_source(str(tmp_path / "missing"), image_size=(8, 8))


def test_bad_tfrecord_arguments(tmp_path):
    with pytest.raises(tapeworks.ConfigError, match="`features` is empty"):
        data.write_tfrecords(str(tmp_path / "x"), {})
    with pytest.raises(tapeworks.ConfigError, match="different numbers of examples"):
        data.write_tfrecords(str(tmp_path / "x"), {"a": np.zeros(3), "b": np.zeros(4)})
    with pytest.raises(tapeworks.ConfigError, match="Cannot store dtype complex128"):
        data.write_tfrecords(str(tmp_path / "x"), {"a": np.zeros(3, complex)})
    with pytest.raises(tapeworks.ConfigError, match="TFRecord files not found"):
        data.tfrecord_source([str(tmp_path / "missing.tfrecord")], {})
    with pytest.raises(tapeworks.ConfigError, match="could not be sliced into examples"):
        data.pipeline((np.zeros(3), np.zeros(4)), batch_size=2, training=True)
