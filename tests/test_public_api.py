"""The public API: every public name is annotated, type-checks, and is on an API reference page.

The public names are what users import (`tapeworks.Trainer`,
`tapeworks.deploy.export`, ...): PUBLIC below. Every parameter and return of
their signatures (a class's `__init__` and public methods) carries a type
annotation, mypy finds no error in the modules that define them, and the API
reference (docs/api*.md) documents each by that public name.
"""

import importlib
import inspect
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

PUBLIC = {
    "tapeworks": ["Trainer", "Task", "StepHooks", "CaptureCallback", "StaticWeights",
                  "ScheduledWeights", "UncertaintyWeighting", "GradNorm", "gradient_penalty",
                  "TapeworksError", "ConfigError", "KerasLoopInStepError", "MissingGradientError",
                  "DataSpecError", "LossError", "NonFiniteError", "CheckpointError",
                  "TapeworksWarning", "CorrectnessWarning", "PerformanceWarning"],
    "tapeworks.data": ["pipeline", "without_autotuning", "check", "Finding", "write_tfrecords",
                       "tfrecord_source", "generator_source", "image_folder_source",
                       "locate_corruption"],
    "tapeworks.deploy": ["export", "ExportError", "Registry", "RegistryError"],
    "tapeworks.prune": ["Pruning", "ConstantSparsity", "PolynomialDecay"],
    "tapeworks.distribute": ["strategy", "linear_scaling"],
    "tapeworks.lint": ["check_source"],
}


def _public_functions():
    """[(public name, function)] of every public signature, methods included."""
    found = []
    for module_name, names in PUBLIC.items():
        module = importlib.import_module(module_name)
        for name in names:
            obj = getattr(module, name)
            label = f"{module_name}.{name}"
            if inspect.isclass(obj):
                if issubclass(obj, (BaseException, Warning)):
                    continue            # constructed by tapeworks, caught by users
                if obj.__init__ is not object.__init__:     # a class with no __init__
                    found.append((f"{label}.__init__", obj.__init__))
                for attr, value in vars(obj).items():
                    if not attr.startswith("_") and inspect.isfunction(value):
                        found.append((f"{label}.{attr}", value))
            else:
                found.append((label, obj))
    return found


def test_every_public_signature_is_annotated():
    missing = []
    for label, function in _public_functions():
        signature = inspect.signature(function)
        for parameter in signature.parameters.values():
            if parameter.name not in ("self", "cls") and \
                    parameter.annotation is inspect.Parameter.empty:
                missing.append(f"{label}({parameter.name})")
        if signature.return_annotation is inspect.Signature.empty:
            missing.append(f"{label} -> ?")
    assert len(_public_functions()) >= 70
    assert missing == []


def _defining_files():
    files = set()
    for module_name, names in PUBLIC.items():
        module = importlib.import_module(module_name)
        files.add(pathlib.Path(module.__file__))
        for name in names:
            defined_in = inspect.getmodule(getattr(module, name))
            files.add(pathlib.Path(defined_in.__file__))
    return sorted(str(f.relative_to(ROOT)) for f in files)


@pytest.mark.slow
def test_mypy_finds_no_error_in_the_public_modules(tmp_path):
    files = _defining_files()
    assert "tapeworks/engine/trainer.py" in files
    run = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"),
                          *files], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def test_the_api_reference_documents_every_public_name_by_it():
    pages = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("api*.md")))
    documented = set(re.findall(r"^::: (\S+)", pages, flags=re.M))
    expected = {f"{module}.{name}" for module, names in PUBLIC.items() for name in names}
    assert expected - documented == set()
    # No internal path: each is documented where users import it from.
    assert [d for d in documented if ".engine." in d or d.count(".") > 2] == []
