"""The user's data in, checked batches out (Keras' data adapters and epoch iterator).

`adapters.py` turns arrays, dicts, tf.data, PyDatasets and generators into
one batched `PreparedData` and walks it across epochs (`EpochBatches`);
`data_stage.py` is the stage `fit` calls once: validation split, the user's
pipelines read once for mistakes, inputs and labels checked against the
task, the input planner chosen; `data_position.py` says how a resumed run's
data is put back; `input_planner.py` chooses how a built pipeline runs, by
measurement; `iterator_release.py` lets go of finished iterators off the
training thread.

May import: the step and checks rooms, tapeworks.data, tapeworks.errors.
"""
