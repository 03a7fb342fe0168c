"""Runs the checker over files and folders, with configuration from pyproject.toml."""

import dataclasses
import json
import os
import sys

from tapeworks.lint.checker import check_source
from tapeworks.lint.rules import PARSE_ERROR, RULES

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

SKIP_DIRS = {".git", ".hg", ".tox", ".venv", "venv", "__pycache__", "node_modules",
             ".mypy_cache", ".pytest_cache", "build", "dist"}


class LintUsageError(Exception):
    """Bad arguments or configuration: exit status 2."""


@dataclasses.dataclass
class Config:
    select: tuple = ()
    ignore: tuple = ()
    exclude: tuple = ()

    @classmethod
    def from_pyproject(cls, path):
        """Reads `[tool.tapeworks.lint]`: `select`, `ignore`, `exclude` lists."""
        with open(path, "rb") as f:
            try:
                data = tomllib.load(f)
            except tomllib.TOMLDecodeError as error:
                raise LintUsageError(f"{path} is not valid TOML: {error}. Fix the file or "
                                     "pass --config with another one.") from None
        section = data.get("tool", {}).get("tapeworks", {}).get("lint", {})
        unknown = set(section) - {"select", "ignore", "exclude"}
        if unknown:
            raise LintUsageError(
                f"{path}: unknown key(s) in [tool.tapeworks.lint]: {', '.join(sorted(unknown))}. "
                "Expected select, ignore and exclude.")
        config = cls(tuple(section.get("select", ())), tuple(section.get("ignore", ())),
                     tuple(section.get("exclude", ())))
        validate_codes(config.select + config.ignore, where=str(path))
        return config


def validate_codes(codes, where="the command line"):
    known = set(RULES) | {PARSE_ERROR}
    for code in codes:
        if not any(k.startswith(code) for k in known):
            raise LintUsageError(
                f"Unknown rule code {code!r} in {where}. Expected codes like "
                f"{', '.join(sorted(RULES)[:3])}... (`tapeworks lint --list` shows them all).")


def find_pyproject(start):
    folder = os.path.abspath(start if os.path.isdir(start) else os.path.dirname(start) or ".")
    while True:
        candidate = os.path.join(folder, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def python_files(paths, exclude=()):
    """The .py files under `paths`, in a stable order."""
    for path in paths:
        if not os.path.exists(path):
            raise LintUsageError(f"No such file or folder: {path}. Expected paths of Python "
                                 "files or folders to check.")
        if os.path.isfile(path):
            yield path
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not any(
                os.path.join(root, d).endswith(e.rstrip("/")) for e in exclude))
            for name in sorted(files):
                full = os.path.join(root, name)
                if name.endswith(".py") and not any(e in full for e in exclude):
                    yield full


def lint_paths(paths, config):
    """Returns (findings, number of files checked)."""
    findings = []
    count = 0
    for path in python_files(paths, config.exclude):
        count += 1
        with open(path, "rb") as f:
            raw = f.read()
        source = raw.decode("utf-8", errors="replace")
        findings.extend(check_source(source, path, select=config.select, ignore=config.ignore))
    return findings, count


def format_findings(findings, fmt, files):
    if fmt == "json":
        return json.dumps({"files": files, "findings": [f.as_dict() for f in findings]},
                          indent=2)
    lines = [f.as_text() for f in findings]
    return "\n".join(lines)
