"""Where examples come from: TFRecord files (written and read), generators, image folders.

Arrays and tensors need no helper: `pipeline()` slices them. Everything here
returns a `tf.data.Dataset` of single examples, ready for `pipeline()`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from tapeworks.errors import ConfigError, DataSpecError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence


def write_tfrecords(path_prefix: str | os.PathLike[str], features: Mapping[str, Any],
                    shards: int = 1
                    ) -> tuple[list[str], dict[str, tuple[tuple[int, ...], tf.DType]]]:
    """Writes arrays as `tf.train.Example` records; returns (files, feature_spec).

    Args:
        path_prefix: files are written as `{path_prefix}-00000-of-00004.tfrecord`.
        features: dict of name -> array; all share their first dimension (the
            examples). float arrays are stored as float lists, integer and bool
            arrays as int64 lists, bytes/str arrays as bytes lists.
        shards: number of files, so that reading can interleave them.

    Returns:
        The list of file paths and the feature spec that `tfrecord_source`
        needs to parse them back (name -> (shape, dtype)).
    """
    if not features:
        raise ConfigError("`features` is empty. Expected a dict of name -> array.")
    arrays = {name: np.asarray(value) for name, value in features.items()}
    counts = {len(a) for a in arrays.values()}
    if len(counts) != 1:
        raise ConfigError(f"The feature arrays have different numbers of examples: "
                          f"{sorted(counts)}. Expected one count for all.")
    (count,) = counts
    spec = {name: (a.shape[1:], _stored_dtype(a.dtype)) for name, a in arrays.items()}
    folder = os.path.dirname(path_prefix)
    if folder:
        os.makedirs(folder, exist_ok=True)
    files = [f"{path_prefix}-{i:05d}-of-{shards:05d}.tfrecord" for i in range(shards)]
    for shard, path in enumerate(files):
        with tf.io.TFRecordWriter(path) as writer:
            for index in range(shard, count, shards):
                writer.write(_example(arrays, index).SerializeToString())
    return files, spec


def tfrecord_source(files: str | Iterable[str],
                    feature_spec: Mapping[str, tuple[Sequence[int], tf.DType]], *,
                    skip_corrupt: bool = False,
                    cycle_length: int | None = None) -> tf.data.Dataset:
    """Reads TFRecord files of `tf.train.Example`s, several files in parallel.

    Args:
        files: paths (or a glob pattern).
        feature_spec: name -> (shape, dtype), as returned by `write_tfrecords`.
        skip_corrupt: skip records that fail their checksum (and the unreadable
            rest of a truncated file) instead of failing. The files are scanned
            first and how many records were skipped, in which file, is logged
            and kept in `tfrecord_source.last_skipped`.
        cycle_length: how many files are read at once (default: tf.data's).

    A corrupted file that is not skipped fails training with an error naming
    the file and the record (see `locate_corruption`).
    """
    if isinstance(files, str):
        files = sorted(tf.io.gfile.glob(files))
    files = list(files)
    missing = [f for f in files if not tf.io.gfile.exists(f)]
    if not files or missing:
        raise ConfigError(f"TFRecord files not found: {missing or files}. Expected existing "
                          "paths or a glob pattern that matches some.")
    parse_spec = {name: tf.io.FixedLenFeature(shape, dtype)
                  for name, (shape, dtype) in feature_spec.items()}
    # A function attribute, which mypy does not model: hence the ignores.
    tfrecord_source.last_skipped = {}  # type: ignore[attr-defined]
    if skip_corrupt:
        skipped = {f: p for f, p in locate_corruption(files).items()}
        tfrecord_source.last_skipped = skipped  # type: ignore[attr-defined]
        for path, problem in skipped.items():
            tf.get_logger().warning("tapeworks: %s: skipping from record %d on (%s)",
                                    path, problem["record"], problem["error"])

    def read(path):
        records = tf.data.TFRecordDataset(path)
        return records.ignore_errors() if skip_corrupt else records

    dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
        read, cycle_length=cycle_length, num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True)
    return dataset.map(lambda record: tf.io.parse_single_example(record, parse_spec),
                       num_parallel_calls=tf.data.AUTOTUNE)


tfrecord_source.last_skipped = {}  # type: ignore[attr-defined]  # a function attribute


def locate_corruption(files: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Reads each file record by record; returns {path: {"record", "error"}} for the bad ones.

    `record` is the index of the first record that could not be read (the
    records before it are fine); `error` is TensorFlow's own words ("corrupted
    record at 192", "truncated record at 405").
    """
    found = {}
    for path in files:
        index = 0
        try:
            for _ in tf.data.TFRecordDataset(path):
                index += 1
        except tf.errors.DataLossError as error:
            message = str(error).split("}}")[-1].split("[Op:")[0].strip()
            found[path] = {"record": index, "error": message}
    return found


def generator_source(make: Callable[[], Iterable[Any]], output_signature: Any) -> tf.data.Dataset:
    """Examples from a Python generator: `make()` returns a fresh generator each epoch."""
    if not callable(make):
        raise ConfigError("`make` must be a function returning a generator (so that every "
                          f"epoch can start again). Received: {type(make).__name__}")
    return tf.data.Dataset.from_generator(make, output_signature=output_signature)


def image_folder_source(folder: str | os.PathLike[str], image_size: tuple[int, int], *,
                        color_mode: str = "rgb") -> tuple[tf.data.Dataset, list[str]]:
    """(image, label) examples from `folder/<class name>/<image files>`.

    Keras' `image_dataset_from_directory` does the reading; tapeworks asks it
    for single examples, unshuffled, so that `pipeline()` orders the rest.
    Returns (dataset, class_names).
    """
    import keras

    if not os.path.isdir(folder):
        raise ConfigError(f"No such folder: {folder}. Expected a folder with one sub-folder "
                          "of images per class.")
    dataset = keras.utils.image_dataset_from_directory(
        folder, labels="inferred", batch_size=None, image_size=image_size,
        color_mode=color_mode, shuffle=False, verbose=False)
    return dataset, list(dataset.class_names)


def tfrecord_files_in(dataset):
    """The TFRecord paths a dataset reads, found in its graph (for error messages)."""
    from tapeworks.data.pipeline_check import dataset_graph

    graph = dataset_graph(dataset)
    paths = []
    for node in graph.node:
        tensor = node.attr["value"].tensor
        if node.op == "Const" and tensor.dtype == tf.string.as_datatype_enum:
            values = tf.io.parse_tensor(tensor.SerializeToString(), tf.string).numpy()
            for value in np.asarray(values).reshape(-1):
                path = value.decode("utf-8", "replace")
                if os.path.isfile(path) and path not in paths:
                    paths.append(path)
    return paths


def corruption_error(dataset, error):
    """A DataSpecError naming the corrupted file and record, from a DataLossError."""
    files = tfrecord_files_in(dataset)
    found = locate_corruption(files) if files else {}
    if not found:
        reason = next((line.strip() for line in str(error).splitlines()
                       if "record" in line or "corrupt" in line), str(error).splitlines()[0])
        return DataSpecError(
            f"The input data could not be read: {reason[:300]}. Expected "
            "readable records. Fix: check the input files, or pass skip_corrupt=True to "
            "tapeworks.data.tfrecord_source to skip bad records.")
    where = "; ".join(f"{path}: record {p['record']} ({p['error']})" for path, p in found.items())
    return DataSpecError(
        f"Corrupted or truncated TFRecord data: {where}. Expected every record to pass its "
        "checksum. Fix: re-create the file(s), or pass skip_corrupt=True to "
        "tapeworks.data.tfrecord_source to skip bad records (and count them).")


def _stored_dtype(dtype):
    if np.issubdtype(dtype, np.floating):
        return tf.float32
    if np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.bool_):
        return tf.int64
    if dtype.kind in ("S", "U", "O"):
        return tf.string
    raise ConfigError(f"Cannot store dtype {dtype} in a tf.train.Example. Expected float, "
                      "integer, bool or bytes arrays.")


def _example(arrays, index):
    feature = {}
    for name, array in arrays.items():
        value = np.asarray(array[index]).reshape(-1)
        kind = _stored_dtype(array.dtype)
        if kind == tf.float32:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=value))
        elif kind == tf.int64:
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=value))
        else:
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[v.encode() if isinstance(v, str) else bytes(v) for v in value]))
    return tf.train.Example(features=tf.train.Features(feature=feature))
