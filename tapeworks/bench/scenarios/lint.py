"""Scenario `lint`: `tapeworks lint` over real TensorFlow code this project did not write.

The corpus is the source of `tf-models-official` and `keras-hub`, fetched from
PyPI with `pip download --no-deps` at benchmark time (never committed) and
unpacked into a temporary folder. `--quick` lints the installed `keras`
package's layers instead, which needs no network. Reported: files, findings per rule,
and files per second on one core (median of repeats). A sample of findings
(the first few of each rule, in path order) is written beside the report with
its source lines, for checking by hand.
"""

import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

from tapeworks.lint.rules import RULES
from tapeworks.lint.runner import Config, lint_paths

DESCRIPTION = ("tapeworks lint over tf-models-official and keras-hub (downloaded at run time): "
               "findings per rule, files/s")
PACKAGES = ("tf-models-official", "keras-hub")
SAMPLE_PER_RULE = 5


def _download(folder):
    wheels = os.path.join(folder, "wheels")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary",
                    ":all:", "-d", wheels, *PACKAGES], check=True, capture_output=True)
    roots = []
    for name in sorted(os.listdir(wheels)):
        target = os.path.join(folder, name.split("-")[0])
        with zipfile.ZipFile(os.path.join(wheels, name)) as wheel:
            wheel.extractall(target)
        roots.append((name, target))
    return roots


def _installed_keras_layers():
    # Its layers alone (about 290 of its 900 files): a smoke run for the
    # tests, which a whole pass of keras three times made a minute long.
    import keras

    return [(f"keras {keras.__version__} layers (installed)",
             os.path.join(os.path.dirname(keras.__file__), "src", "layers"))]


def _timed_lint(paths, repeats):
    times = []
    for _ in range(repeats):
        start = time.process_time()  # CPU time of this one process: one core
        findings, files = lint_paths(paths, Config())
        times.append(time.process_time() - start)
    return findings, files, statistics.median(times)


def write_sample(findings, roots, path):
    """The first findings of each rule, with the line they point at, for a hand check."""
    by_rule = collections.defaultdict(list)
    for finding in sorted(findings):
        if len(by_rule[finding.code]) < SAMPLE_PER_RULE:
            by_rule[finding.code].append(finding)
    lines = ["# Sample of `tapeworks lint` findings for a hand check", "",
             "Corpus: " + ", ".join(name for name, _ in roots), ""]
    for code in sorted(by_rule):
        lines += [f"## {code} {RULES[code].name}", ""]
        for finding in by_rule[code]:
            relative = finding.path
            for _, root in roots:
                relative = os.path.relpath(finding.path, root) if finding.path.startswith(
                    root) else relative
            with open(finding.path, encoding="utf-8", errors="replace") as f:
                source = f.read().splitlines()
            start = max(finding.line - 3, 0)
            excerpt = "\n".join(source[start:finding.line + 2])
            lines += [f"- `{relative}:{finding.line}` {finding.message}", "",
                      "```python", excerpt, "```", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def run(quick=False, repeats=5, out_dir=None):
    with tempfile.TemporaryDirectory() as folder:
        roots = _installed_keras_layers() if quick else _download(folder)
        paths = [root for _, root in roots]
        findings, files, seconds = _timed_lint(paths, repeats)
        counts = collections.Counter(f.code for f in findings)
        rows = [{"code": code, "rule": rule.name, "findings": counts.get(code, 0),
                 "per_1000_files": 1000 * counts.get(code, 0) / max(files, 1),
                 "rule_group": "findings per rule", "notes": {}}
                for code, rule in RULES.items()]
        sample = None
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            sample = os.path.join(out_dir, "lint-sample.md")
            write_sample(findings, roots, sample)
    return {
        "columns": [("code", "code"), ("rule", "rule"), ("findings", "findings"),
                    ("per_1000_files", "per 1,000 files")],
        "rows": rows,
        "facts": {"corpus": ", ".join(name for name, _ in roots), "files": files,
                  "seconds (CPU, one core, median)": seconds,
                  "files per second (one core)": files / seconds,
                  "parse errors (TW000)": counts.get("TW000", 0),
                  "sample for hand check": sample or "not written"},
        "chart": {"group": "rule_group", "bar": "code", "value": "findings",
                  "label": "findings"},
        "extra_files": [sample] if sample else [],
    }
