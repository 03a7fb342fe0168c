"""Which steps of a pipeline a Keras or TensorFlow utility built, read from its graph.

`keras.utils.timeseries_dataset_from_array`, `image_dataset_from_directory`,
`text_dataset_from_directory`, `audio_dataset_from_directory` and
`tf.data.experimental.make_csv_dataset` return datasets whose first steps
the user never wrote and cannot edit: a finding about them must be dropped,
or say what the user can do at their call (an argument of the utility, a
`.prefetch()` after it). `find` recognises each utility by the shape it
builds (its steps from the source, and what its maps compute), so
`pipeline_check` can count only the user's steps.
"""

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class UtilityPrefix:
    """The first steps of a pipeline, built by one utility.

    Attributes:
        name: the utility as the user calls it, e.g.
            "keras.utils.timeseries_dataset_from_array".
        end: the index, in the pipeline's chain, of the utility's last step.
        shuffle_fix: how the user turns its shuffle on at the call; "" where
            an unshuffled order is the utility's own default and often meant
            (windows of a time series, kept in time order).
    """

    name: str
    end: int
    shuffle_fix: str = ""

    def holds(self, index):
        """Whether the step at `index` of the chain is the utility's."""
        return index <= self.end


# Each utility's steps from the source, as the op names of the chain joined by
# spaces (optional parts for its arguments: targets, labels, shuffle, batch).
_TIMESERIES = re.compile(r"^TensorDataset RepeatDataset ZipDataset ParallelMapDatasetV2"
                         r"( ZipDataset)? PrefetchDataset( ShuffleDatasetV3)?( BatchDatasetV2)?")
# (audio_dataset_from_directory batches after its prefetch, padded to the longest clip.)
_FROM_DIRECTORY = re.compile(r"^TensorSliceDataset ZipDataset( ShuffleDatasetV3)? "
                             r"ParallelMapDatasetV2( BatchDatasetV2)?( PrefetchDataset)?"
                             r"( (Padded)?BatchDatasetV2)?")
_DECODERS = (("audio", {"DecodeWav"}),
             ("image", {"DecodeImage", "DecodeJpeg", "DecodePng", "DecodeBmp", "DecodeGif"}))


def find(chain, called_ops):
    """The `UtilityPrefix` that starts `chain`, or None when the user built it all.

    Args:
        chain: the pipeline's dataset nodes, source first (`pipeline_chain`).
        called_ops: `called_ops(node)` -> every op type the node's functions run.
    """
    ops = " ".join(node.op for node in chain)
    match = _TIMESERIES.match(ops)
    if match and "GatherV2" in called_ops(chain[3]):
        return UtilityPrefix("keras.utils.timeseries_dataset_from_array",
                             _last_index(match))
    match = _FROM_DIRECTORY.match(ops)
    if match:
        mapped = called_ops(next(n for n in chain if n.op == "ParallelMapDatasetV2"))
        if "ReadFile" in mapped:
            kind = next((kind for kind, decoders in _DECODERS if mapped & decoders), "text")
            return UtilityPrefix(f"keras.utils.{kind}_dataset_from_directory",
                                 _last_index(match), "shuffle=True (its default)")
    return _csv_reader(chain, called_ops)


def _csv_reader(chain, called_ops):
    """`make_csv_dataset` (or `make_batched_features_dataset`): files interleaved, then a map
    TensorFlow builds with inter-op parallelism off (no `Dataset.map` call can), a prefetch."""
    reads = next((i for i, node in enumerate(chain) if "Interleave" in node.op
                  and "filename_to_dataset" in node.attr["f"].func.name), None)
    if reads is None:
        return None
    for index in range(reads + 1, len(chain)):
        node = chain[index]
        if node.op == "MapDataset" and "use_inter_op_parallelism" in node.attr \
                and not node.attr["use_inter_op_parallelism"].b:
            end = index + 1 if index + 1 < len(chain) and \
                chain[index + 1].op == "PrefetchDataset" else index
            csv = {"CSVDataset", "CSVDatasetV2"} & called_ops(chain[reads])
            return UtilityPrefix("tf.data.experimental.make_csv_dataset" if csv else
                                 "tf.data.experimental.make_batched_features_dataset",
                                 end, "shuffle=True (its default)")
    return None


def _last_index(match):
    return len(match.group(0).split(" ")) - 1
