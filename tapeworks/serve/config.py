"""What to serve: TensorFlow Serving's model config, its base-path flags, or a tapeworks registry.

A `ServingPlan` is what the server should have loaded right now: for each
model, its base path, the versions wanted and the version labels. It is
re-read on every poll, so a promotion in the registry (which rewrites
`ROOT/models.config`), a new version folder under a base path (TF Serving's
default policy serves the latest) or an edited config file all reach the
server without a restart.

The config file is parsed by protobuf's own text format parser, into TF
Serving's `ModelServerConfig` from `tensorflow-serving-api` when it is
installed (the optional `grpc` extra: it requires TensorFlow >= 2.21), else
into message classes built here from TF Serving's `model_server_config.proto`
(the subset a model config list uses, with TF Serving's field numbers).
"""

import dataclasses
import os

from tapeworks.deploy.registry import (CONFIG_FILE, LOCK_FILE, NAME, Registry, recorded,
                                       version_folders)
from tapeworks.errors import TapeworksError


class ServingConfigError(TapeworksError, ValueError):
    """The command line or model config cannot describe what to serve."""


@dataclasses.dataclass
class ModelPlan:
    name: str
    base_path: str
    versions: dict            # version -> folder (what should be loaded)
    labels: dict              # label -> version (TF Serving's version_labels, plus the registry's)
    current: int = None       # the version a request without version or label gets


def builtin_model_server_config():
    """TF Serving's ModelServerConfig (model_config_list subset) as protobuf message classes.

    Built here for machines without tensorflow-serving-api; `parse_model_config`
    uses TF Serving's own message when that package is installed.
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="tapeworks_model_server_config.proto",
                                               package="tensorflow.serving", syntax="proto3")

    def message(name, fields, nested=()):
        m = descriptor_pb2.DescriptorProto(name=name)
        for field_name, number, kind, label, type_name in fields:
            f = m.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                f.type_name = type_name
        m.nested_type.extend(nested)
        return m

    optional, repeated = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    policy = message("ServableVersionPolicy", [
        ("latest", 100, F.TYPE_MESSAGE, optional,
         ".tensorflow.serving.ServableVersionPolicy.Latest"),
        ("all", 101, F.TYPE_MESSAGE, optional, ".tensorflow.serving.ServableVersionPolicy.All"),
        ("specific", 102, F.TYPE_MESSAGE, optional,
         ".tensorflow.serving.ServableVersionPolicy.Specific"),
    ], nested=[message("Latest", [("num_versions", 1, F.TYPE_UINT32, optional, None)]),
               message("All", []),
               message("Specific", [("versions", 1, F.TYPE_INT64, repeated, None)])])
    labels_entry = message("VersionLabelsEntry", [
        ("key", 1, F.TYPE_STRING, optional, None), ("value", 2, F.TYPE_INT64, optional, None)])
    labels_entry.options.map_entry = True
    config = message("ModelConfig", [
        ("name", 1, F.TYPE_STRING, optional, None),
        ("base_path", 2, F.TYPE_STRING, optional, None),
        ("model_platform", 4, F.TYPE_STRING, optional, None),
        ("model_version_policy", 7, F.TYPE_MESSAGE, optional,
         ".tensorflow.serving.ServableVersionPolicy"),
        ("version_labels", 8, F.TYPE_MESSAGE, repeated,
         ".tensorflow.serving.ModelConfig.VersionLabelsEntry"),
    ], nested=[labels_entry])
    config_list = message("ModelConfigList", [
        ("config", 1, F.TYPE_MESSAGE, repeated, ".tensorflow.serving.ModelConfig")])
    server = message("ModelServerConfig", [
        ("model_config_list", 1, F.TYPE_MESSAGE, optional,
         ".tensorflow.serving.ModelConfigList")])
    proto.message_type.extend([policy, config, config_list, server])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.serving.ModelServerConfig"))


_SERVER_CONFIG = None


def parse_model_config(text, where="the model config file", message_class=None):
    """[(name, base_path, policy, labels)] from TF Serving's text-format ModelServerConfig.

    `message_class`: the ModelServerConfig message to parse into (default: TF
    Serving's own when installed, else `builtin_model_server_config()`).
    """
    global _SERVER_CONFIG
    from google.protobuf import text_format

    if message_class is not None:
        config = message_class()
    elif _SERVER_CONFIG is None:
        try:
            # TF Serving's own message, every field of it (logging_config, ...),
            # when the optional tensorflow-serving-api is installed.
            from tensorflow_serving.config.model_server_config_pb2 import ModelServerConfig

            _SERVER_CONFIG = ModelServerConfig
        except ImportError:
            _SERVER_CONFIG = builtin_model_server_config()
    if message_class is None:
        config = _SERVER_CONFIG()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as error:
        raise ServingConfigError(
            f"{where} is not a TensorFlow Serving model config ({error}). Expected "
            "`model_config_list { config { name: \"...\" base_path: \"...\" } }`.") from None
    found = []
    for model in config.model_config_list.config:
        if model.model_platform not in ("", "tensorflow"):
            raise ServingConfigError(
                f"Model {model.name!r} in {where} has model_platform "
                f"{model.model_platform!r}; only \"tensorflow\" (SavedModel) is served.")
        policy = model.model_version_policy
        kind = next((k for k in ("latest", "all", "specific") if policy.HasField(k)), "latest")
        if kind == "latest":
            chosen = ("latest", policy.latest.num_versions or 1)
        elif kind == "all":
            chosen = ("all", None)
        else:
            chosen = ("specific", list(policy.specific.versions))
        found.append((model.name, model.base_path, chosen, dict(model.version_labels)))
    return found


def _check_model_name(name, where):
    if not NAME.match(name or ""):
        raise ServingConfigError(
            f"Model name {name!r} in {where} cannot be served: names are one URL path "
            "component (letters, digits, '_', '-', '.'; no '/', no '..').")


def _resolve(base_path, root_dir):
    base_path = base_path[len("file://"):] if base_path.startswith("file://") else base_path
    if "://" in base_path:
        raise ServingConfigError(
            f"base_path {base_path!r}: only local folders are served (no cloud file systems).")
    return os.path.abspath(os.path.join(root_dir, base_path))


def _apply_policy(folders, policy):
    kind, value = policy
    if kind == "latest":
        return {v: folders[v] for v in sorted(folders)[-value:]}
    if kind == "all":
        return dict(folders)
    return {v: folders[v] for v in value if v in folders}


def _registry_labels(base_path, versions):
    """The registry's human labels ("v1.2") of the wanted versions, label -> version."""
    labels = {}
    for version, folder in versions.items():
        label = recorded(os.path.join(base_path, folder)).get("label")
        if label:
            labels[label] = version
    return labels


class Source:
    """Where the plan comes from; `plan()` reads it again (cheap: a few stat and read calls).

    One of: `root` (a tapeworks registry, or any folder of TF Serving model
    folders), `model_config_file`, or `model_name` with `model_base_path`.
    """

    def __init__(self, root=None, *, model_config_file=None, model_name=None,
                 model_base_path=None):
        given = [x for x in (root, model_config_file, model_base_path) if x]
        if len(given) != 1:
            raise ServingConfigError(
                "Serve one of: a registry ROOT, --model_config_file, or --model_name with "
                "--model_base_path. Received: "
                f"root={root!r}, model_config_file={model_config_file!r}, "
                f"model_base_path={model_base_path!r}.")
        if model_base_path and not model_name:
            model_name = "default"   # TF Serving's default --model_name
        self.root = root and os.path.abspath(root)
        self.model_config_file = model_config_file and os.path.abspath(model_config_file)
        self.model_name = model_name
        self.model_base_path = model_base_path
        where = self.root or self.model_config_file or model_base_path
        if not os.path.exists(where):
            raise ServingConfigError(f"{where} does not exist. Expected a folder of models "
                                     "(or a model config file).")

    def describe(self):
        if self.root:
            return f"registry {self.root}"
        if self.model_config_file:
            return f"model config {self.model_config_file}"
        return f"model {self.model_name!r} at {self.model_base_path}"

    def plan(self):
        """{name: ModelPlan}: what should be served now."""
        if self.model_base_path:
            entries = [(self.model_name, self.model_base_path, ("latest", 1), {})]
            root_dir, where = os.getcwd(), "--model_base_path"
        elif self.model_config_file:
            with open(self.model_config_file) as f:
                entries = parse_model_config(f.read(), self.model_config_file)
            # Relative base paths are read from the working folder, as TF Serving does.
            root_dir, where = os.getcwd(), self.model_config_file
        elif os.path.isfile(os.path.join(self.root, CONFIG_FILE)):
            with open(os.path.join(self.root, CONFIG_FILE)) as f:
                entries = parse_model_config(f.read(), os.path.join(self.root, CONFIG_FILE))
            root_dir, where = self.root, self.root
        elif os.path.exists(os.path.join(self.root, LOCK_FILE)):
            # A registry in which nothing was promoted yet: nothing is current.
            entries, root_dir, where = [], self.root, self.root
        else:
            # A folder of TF Serving model folders with no config: each served at
            # its latest version (TF Serving's default policy).
            entries = [(name, name, ("latest", 1), {}) for name in Registry(self.root).models()]
            root_dir, where = self.root, self.root
        plans = {}
        for name, base_path, policy, labels in entries:
            _check_model_name(name, where)
            base = _resolve(base_path, root_dir)
            if self.root and os.path.dirname(base) != self.root:
                raise ServingConfigError(
                    f"Model {name!r} has base_path {base}, outside the served root "
                    f"{self.root}. Only models under ROOT are served.")
            versions = _apply_policy(version_folders(base), policy)
            all_labels = _registry_labels(base, versions)
            all_labels.update(labels)
            current = max(versions) if versions else None
            plans[name] = ModelPlan(name, base, versions, all_labels, current)
        return plans
