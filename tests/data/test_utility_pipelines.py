"""Findings on pipelines Keras' and TensorFlow's utilities build count only the user's steps.

Each utility reads synthetic files written to tmp_path (nothing is
downloaded). What the utility built is never reported as the user's mistake;
what the user adds after it is, phrased as what they can do at their call.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks import data
from tapeworks.data import pipeline_check

AUTOTUNE = tf.data.AUTOTUNE


def codes(dataset):
    return [f.code for f in data.check(dataset, training=True)]


def utility_of(dataset):
    found = pipeline_check.built_by(pipeline_check.dataset_graph(dataset))
    return found.name if found else None


def series(shuffle=False, targets=True):
    values = np.arange(200, dtype="float32").reshape(100, 2)
    return keras.utils.timeseries_dataset_from_array(
        values, values[:, 0] if targets else None, sequence_length=5, batch_size=8,
        shuffle=shuffle, seed=1)


@pytest.fixture
def csv_file(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("a,b,label\n" + "\n".join(f"{i},{i * 0.5},{i % 2}" for i in range(40)))
    return str(path)


def csv_dataset(csv_file, **options):
    return tf.data.experimental.make_csv_dataset(csv_file, batch_size=4, label_name="label",
                                                 num_epochs=1, **options)


@pytest.fixture
def image_folder(tmp_path):
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (tmp_path / label).mkdir()
        for index in range(3):
            keras.utils.save_img(str(tmp_path / label / f"{index}.png"),
                                 rng.uniform(0, 255, size=(6, 6, 3)))
    return str(tmp_path)


@pytest.fixture
def text_folder(tmp_path):
    for label in ("neg", "pos"):
        (tmp_path / label).mkdir()
        for index in range(3):
            (tmp_path / label / f"{index}.txt").write_text(f"{label} review number {index}")
    return str(tmp_path)


@pytest.fixture
def audio_folder(tmp_path):
    for label in ("no", "yes"):
        (tmp_path / label).mkdir()
        for index in range(3):
            # Clips of different lengths: the utility pads each batch.
            clip = tf.random.stateless_uniform((300 + 50 * index, 1), (1, index), -1.0, 1.0)
            tf.io.write_file(str(tmp_path / label / f"{index}.wav"),
                             tf.audio.encode_wav(clip, 8000))
    return str(tmp_path)


def images(folder, **options):
    return keras.utils.image_dataset_from_directory(folder, image_size=(6, 6), batch_size=2,
                                                    seed=1, verbose=False, **options)


def texts(folder, **options):
    return keras.utils.text_dataset_from_directory(folder, batch_size=2, seed=1,
                                                   verbose=False, **options)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("targets", [False, True])
def test_a_timeseries_dataset_has_no_finding_of_its_own(shuffle, targets):
    # Its batching follows its prefetch, and its windows stay in time order
    # by default: Keras' layout, nothing the user wrote.
    dataset = series(shuffle, targets)
    assert utility_of(dataset) == "keras.utils.timeseries_dataset_from_array"
    assert codes(dataset) == []


def test_make_csv_dataset_has_no_finding_of_its_own(csv_file):
    # Its decoding map runs on whole batches without parallel calls: TensorFlow's.
    for options in ({}, {"shuffle": False}):
        dataset = csv_dataset(csv_file, **options)
        assert utility_of(dataset) == "tf.data.experimental.make_csv_dataset"
        assert codes(dataset) == []


def test_from_directory_utilities_have_no_finding_of_their_own(image_folder, text_folder):
    assert utility_of(images(image_folder)) == "keras.utils.image_dataset_from_directory"
    assert utility_of(texts(text_folder)) == "keras.utils.text_dataset_from_directory"
    assert codes(images(image_folder)) == codes(texts(text_folder)) == []


def test_audio_from_directory_batches_after_its_prefetch_without_a_finding(audio_folder):
    for options in ({}, {"output_sequence_length": 400}):
        dataset = keras.utils.audio_dataset_from_directory(
            audio_folder, batch_size=2, seed=1, verbose=False, **options)
        assert utility_of(dataset) == "keras.utils.audio_dataset_from_directory"
        assert codes(dataset) == []


def test_the_users_steps_after_a_utility_are_reported_at_their_call(csv_file):
    # (With tf.data's own prefetch at the end off: by default it adds one.)
    no_own_prefetch = tf.data.Options()
    no_own_prefetch.experimental_optimization.inject_prefetch = False
    dataset = csv_dataset(csv_file).map(lambda x, y: (x, y), num_parallel_calls=AUTOTUNE)
    dataset = dataset.with_options(no_own_prefetch)
    (finding,) = data.check(dataset, training=True)
    assert finding.code == "TD001"
    assert "inside `tf.data.experimental.make_csv_dataset`" in finding.message
    assert "after your last transformation of what " \
        "`tf.data.experimental.make_csv_dataset` returns" in finding.fix
    # Prefetched by the user: nothing left to say.
    assert codes(dataset.prefetch(AUTOTUNE)) == []


def test_a_sequential_map_the_user_adds_is_still_theirs(image_folder):
    # (A stateful map: tf.data parallelises a stateless one itself.)
    dataset = images(image_folder).map(
        lambda x, y: (tf.image.random_brightness(x, 0.1), y)).prefetch(AUTOTUNE)
    (finding,) = data.check(dataset, training=True)
    assert finding.code == "TD005"
    assert "inside" not in finding.step   # the user's own map, by its step


def test_an_unshuffled_folder_utility_is_told_its_argument(image_folder, text_folder):
    for dataset, name in ((images(image_folder, shuffle=False), "image_dataset_from_directory"),
                          (texts(text_folder, shuffle=False), "text_dataset_from_directory")):
        (finding,) = data.check(dataset, training=True)
        assert finding.code == "TD009"
        assert f"pass shuffle=True (its default) to `keras.utils.{name}`" in finding.fix


def test_a_pipeline_the_user_wrote_like_a_utility_is_the_users(tmp_path):
    # Files read by the user's own map (no zip of paths and labels): their steps.
    (tmp_path / "a.txt").write_text("x")
    dataset = (tf.data.Dataset.from_tensor_slices([str(tmp_path / "a.txt")])
               .map(tf.io.read_file, num_parallel_calls=AUTOTUNE).batch(1).prefetch(AUTOTUNE))
    assert utility_of(dataset) is None
    assert codes(dataset) == ["TD009"]
    assert "sliced from memory" in data.check(dataset, training=True)[0].message


def test_fit_on_a_csv_utility_shows_no_data_warning(csv_file):
    dataset = csv_dataset(csv_file).map(
        lambda x, y: (tf.stack([tf.cast(x["a"], tf.float32), x["b"]], axis=-1), y),
        num_parallel_calls=AUTOTUNE
    ).prefetch(AUTOTUNE)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tapeworks.Trainer(model, jit_compile=False, steps_per_call=2).fit(
            dataset, epochs=1, verbose=0)
    assert [str(w.message) for w in caught if "data check" in str(w.message)] == []


def test_a_utilitys_shuffle_or_batch_before_the_users_step_is_fixed_at_its_call(
        image_folder, text_folder):
    # The user's cache after the utility's shuffle (the text-classification
    # tutorial), the user's shuffle after the utility's batching: the fix
    # is an argument of the utility, not a step the user cannot move.
    cached = texts(text_folder).cache().prefetch(AUTOTUNE)
    (finding,) = [f for f in data.check(cached, training=True) if f.code == "TD004"]
    assert finding.fix.startswith(
        "pass `shuffle=False` to `keras.utils.text_dataset_from_directory` and shuffle "
        "after your cache")
    reshuffled = images(image_folder).shuffle(8).prefetch(AUTOTUNE)
    (finding,) = [f for f in data.check(reshuffled, training=True) if f.code == "TD002"]
    assert finding.fix.startswith(
        "pass `batch_size=None` to `keras.utils.image_dataset_from_directory`")
    # The user's own shuffle and cache keep the usual fix.
    own = (tf.data.Dataset.from_tensor_slices(np.zeros((64, 2), "float32")).shuffle(64)
           .cache().batch(8).prefetch(AUTOTUNE))
    (finding,) = [f for f in data.check(own, training=True) if f.code == "TD004"]
    assert finding.fix.startswith("cache first, then shuffle")
