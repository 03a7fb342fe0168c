"""Which ops of a SavedModel's graph reach outside it: files, processes, the network.

The trust model. A SavedModel is a program: TensorFlow runs its graph's
ops, and loading one runs its init op (TF1) or restore functions (TF2).
Nothing tapeworks loads runs Python code (no pickles, no Lambda layers,
`.keras` files with safe_mode=True), but a graph can still hold ops that
read or write files (`WriteFile`, `ReadFile`, `Save`, dataset readers),
start Python (`PyFunc`, `EagerPyFunc`: only where the Python that defines
them is present) or talk to other machines (`Rpc`, collectives). So before a
SavedModel is loaded, by `Registry.publish` and by `tapeworks serve`, every
op of every graph and function in `saved_model.pb` is read (the file is
parsed, nothing is run) and a model with such an op is refused, naming the
op and where it is, unless the caller lists it in `allow_ops`.

Exempt: the checkpoint ops of TensorFlow's own saver (`SaveV2`,
`RestoreV2`, `MergeV2Checkpoints`, ...) where the saver puts them (the TF1
saver's name scope, TF2's `_traced_save`/`_traced_restore` functions): they
read the version's own `variables/`. The same ops anywhere else are
refused like the others.

What this does not cover: ops whose effects stay inside the process (a
model can still compute anything, use memory and time: serve with a body
limit and a timeout), and custom ops from shared libraries (a SavedModel
with ops TensorFlow does not know does not load at all). Publish models you
trust; this check stops a model's graph from reaching your files or network
quietly.
"""

import os

from tapeworks.errors import TapeworksError

# Ops that act on the file system, start processes or code, or use the network.
OUTSIDE_OPS = frozenset({
    # files
    "ReadFile", "WriteFile", "MatchingFiles", "MatchingFilesDataset", "ImmutableConst",
    "Save", "SaveSlices", "SaveV2", "Restore", "RestoreSlice", "RestoreV2",
    "MergeV2Checkpoints", "LoadAndRemapMatrix", "GenerateVocabRemapping",
    "InitializeTableFromTextFile", "InitializeTableFromTextFileV2",
    "TFRecordDataset", "TFRecordDatasetV2", "FixedLengthRecordDataset",
    "FixedLengthRecordDatasetV2", "TextLineDataset", "SqlDataset", "ExperimentalSqlDataset",
    "CSVDataset", "CSVDatasetV2", "ExperimentalCSVDataset", "LMDBDataset",
    "ExperimentalLMDBDataset", "SaveDataset", "SaveDatasetV2", "LoadDataset",
    "ExperimentalSaveDataset", "SnapshotDataset", "SnapshotDatasetV2",
    "SnapshotDatasetReader", "DatasetToTFRecord", "ExperimentalDatasetToTFRecord",
    "WholeFileReader", "WholeFileReaderV2", "TFRecordReader", "TFRecordReaderV2",
    "TextLineReader", "TextLineReaderV2", "FixedLengthRecordReader",
    "FixedLengthRecordReaderV2", "LMDBReader", "IdentityReader", "IdentityReaderV2",
    "CreateSummaryFileWriter", "CreateSummaryDbWriter", "SummaryWriter",
    "WriteSummary", "WriteRawProtoSummary", "WriteScalarSummary", "WriteHistogramSummary",
    "WriteImageSummary", "WriteAudioSummary", "WriteGraphSummary", "ImportEvent",
    "FlushSummaryWriter", "CloseSummaryWriter", "DebugIdentity", "DebugIdentityV2",
    "DebugIdentityV3", "DebugNanCount", "DebugNumericSummary", "DebugNumericSummaryV2",
    "Print", "PrintV2",
    # processes and Python code
    "PyFunc", "PyFuncStateless", "EagerPyFunc",
    # the network
    "Rpc", "TryRpc", "RpcCall", "RpcClient", "RpcServer", "RpcServerStart",
    "RpcServerRegister", "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3",
    "CollectiveGather", "CollectiveGatherV2", "CollectiveBcastSend", "CollectiveBcastRecv",
    "CollectiveBcastSendV2", "CollectiveBcastRecvV2", "CollectiveAllToAllV2",
    "CollectiveAllToAllV3", "CollectiveInitializeCommunicator", "NcclAllReduce",
    "_Send", "_Recv", "_HostSend", "_HostRecv", "DataServiceDataset", "DataServiceDatasetV2",
    "DataServiceDatasetV3", "DataServiceDatasetV4", "RegisterDataset", "RegisterDatasetV2",
})
# TensorFlow's saver reads and writes the version's own variables/ with these.
SAVER_OPS = frozenset({"SaveV2", "RestoreV2", "MergeV2Checkpoints", "Save", "Restore",
                       "RestoreSlice", "SaveSlices"})


class UnsafeGraphError(TapeworksError, ValueError):
    """A SavedModel's graph holds ops that reach files, processes or the network."""


def _in_saver(meta_graph, function_name, node_name):
    if function_name is not None:
        return "_traced_save" in function_name or "_traced_restore" in function_name
    scope = meta_graph.saver_def.filename_tensor_name.split("/")[0]
    return bool(scope) and node_name.startswith(scope + "/")


def outside_ops(path):
    """[(op, where)] of the ops in `path`/saved_model.pb that act outside the graph."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    found = []
    for meta_graph in saved.meta_graphs:
        tags = ",".join(meta_graph.meta_info_def.tags) or "untagged"
        places = [(None, meta_graph.graph_def.node)]
        places += [(f.signature.name, f.node_def) for f in meta_graph.graph_def.library.function]
        for function_name, nodes in places:
            for node in nodes:
                if node.op not in OUTSIDE_OPS:
                    continue
                if node.op in SAVER_OPS and _in_saver(meta_graph, function_name, node.name):
                    continue
                where = (f"node {node.name!r} of function {function_name!r}" if function_name
                         else f"node {node.name!r} of the graph")
                found.append((node.op, f"{where} (MetaGraph tags: {tags})"))
    return found


def check_ops(path, allow_ops=()):
    """Raises UnsafeGraphError naming the ops outside `allow_ops` that act outside the graph."""
    found = [(op, where) for op, where in outside_ops(path) if op not in set(allow_ops)]
    if not found:
        return
    listed = "; ".join(f"{op} at {where}" for op, where in found[:5])
    more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
    ops = sorted({op for op, _ in found})
    raise UnsafeGraphError(
        f"The SavedModel at {path} has ops that act outside the model (files, processes or "
        f"the network): {listed}{more}. It was not loaded, so none of them ran. Expected a "
        "graph of computation only. Fix: if you trust this model and want those ops, pass "
        f"allow_ops={ops!r} (`tapeworks serve --allow-ops {','.join(ops)}`).")
