"""Input pipelines: a best-practice tf.data builder, sources, a checker, input-bound diagnosis."""

from tapeworks.data.diagnose import InputReport
from tapeworks.data.pipeline_check import Finding, check
from tapeworks.data.pipeline import pipeline, without_autotuning
from tapeworks.data.sources import (
    generator_source,
    image_folder_source,
    locate_corruption,
    tfrecord_source,
    write_tfrecords,
)

__all__ = ["Finding", "InputReport", "check", "generator_source", "image_folder_source", "locate_corruption",
           "pipeline", "tfrecord_source", "without_autotuning", "write_tfrecords"]
