"""From a trained model to a verified artefact: `export` (SavedModel, .keras)."""

from tapeworks.deploy.export import FORMATS, ExportError, ExportReport, export

__all__ = ["FORMATS", "ExportError", "ExportReport", "export"]
