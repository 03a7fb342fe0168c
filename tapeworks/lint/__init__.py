"""`tapeworks lint`: a static checker for TensorFlow training anti-patterns."""

from tapeworks.lint.checker import check_source
from tapeworks.lint.findings import Finding
from tapeworks.lint.rules import RULES

__all__ = ["Finding", "RULES", "check_source"]
