"""From a trained model to a verified artefact: `export` (SavedModel, .keras, LiteRT), and
the versioned `Registry` that TensorFlow Serving (and `tapeworks serve`) serves from.

Names are imported on first use (PEP 562), as in the top package: the checking
process (`python -m tapeworks.deploy.verify`) then imports only what its
format needs (a LiteRT model needs neither TensorFlow nor Keras).
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # What type checkers and the API reference (griffe) see; at run time the
    # names load on first use, through `__getattr__` below (hence noqa: F401).
    from tapeworks.deploy.artefact import FORMATS, export  # noqa: F401
    from tapeworks.deploy.quantisation import LayerError  # noqa: F401
    from tapeworks.deploy.registry import Registry, RegistryError, VersionInfo  # noqa: F401
    from tapeworks.deploy.report import ExportError, ExportReport  # noqa: F401

_EXPORTS = {"FORMATS": "tapeworks.deploy.artefact", "ExportError": "tapeworks.deploy.report",
            "ExportReport": "tapeworks.deploy.report", "export": "tapeworks.deploy.artefact",
            "LayerError": "tapeworks.deploy.quantisation",
            "Registry": "tapeworks.deploy.registry", "RegistryError": "tapeworks.deploy.registry",
            "VersionInfo": "tapeworks.deploy.registry"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
