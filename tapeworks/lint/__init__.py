"""`tapeworks lint`: a static checker for TensorFlow training anti-patterns."""

from tapeworks.lint.checker import Finding, check_source
from tapeworks.lint.rules import RULES

__all__ = ["Finding", "RULES", "check_source"]
