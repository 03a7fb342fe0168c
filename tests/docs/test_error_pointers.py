"""Every documented error class has its anchor in the guide, and its messages point there."""

import os
import re

from tapeworks import errors
from tapeworks.deploy.graph_ops import UnsafeGraphError
from tapeworks.engine.resume.checkpoint_folder import CheckpointError

PAGE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", f"{errors.ERRORS_PAGE}.md")


def test_every_documented_error_has_its_anchor():
    with open(PAGE, encoding="utf-8") as f:
        anchors = set(re.findall(r"\{#([A-Za-z0-9_-]+)\}", f.read()))
    assert errors.DOCUMENTED_ERRORS <= anchors, errors.DOCUMENTED_ERRORS - anchors


def test_messages_end_with_their_pointer_and_keep_their_text():
    error = errors.DataSpecError("The labels are wrong. Fix: pass others.")
    assert str(error) == ("The labels are wrong. Fix: pass others. "
                          "(see docs: troubleshooting#DataSpecError)")
    assert error.message == "The labels are wrong. Fix: pass others."
    assert str(CheckpointError("No checkpoint loads.")).endswith("troubleshooting#CheckpointError)")
    # A class the guide does not list has no pointer, rather than a broken one.
    assert str(UnsafeGraphError("WriteFile in the init op.")) == "WriteFile in the init op."


WARNINGS = os.path.join(os.path.dirname(PAGE), f"{errors.WARNINGS_PAGE}.md")


def _anchors():
    with open(WARNINGS, encoding="utf-8") as f:
        return set(re.findall(r"\{#([A-Za-z0-9_-]+)\}", f.read()))


def test_every_warning_points_to_a_section_the_guide_has():
    # The sections named at tapeworks' warn() calls, and the categories' defaults.
    package = os.path.join(os.path.dirname(__file__), "..", "..", "tapeworks")
    named = set(errors.WARNING_SECTIONS.values())
    for folder, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    named |= set(re.findall(r'section="([A-Za-z0-9_-]+)"', f.read()))
    assert "dead-gradients" in named and "setup-mistakes" in named
    on_warnings_page = named - errors.DOCUMENTED_ERRORS
    assert on_warnings_page <= _anchors(), on_warnings_page - _anchors()


def test_a_warning_ends_with_its_pointer_once():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        errors.warn("tapeworks: a helper is trainable. Fix: freeze it.",
                    errors.CorrectnessWarning)
        errors.warn("tapeworks: a retrace. Fix: fixed shapes.", errors.PerformanceWarning,
                    section="retracing")
        errors.warn("TD004: no prefetch (see docs: data-checks#TD004)", errors.PerformanceWarning)
        errors.warn("tapeworks: 2 steps were non-finite.", errors.CorrectnessWarning,
                    section="NonFiniteError")
    assert [str(w.message) for w in caught] == [
        "tapeworks: a helper is trainable. Fix: freeze it. "
        "(see docs: warnings#CorrectnessWarning)",
        "tapeworks: a retrace. Fix: fixed shapes. (see docs: warnings#retracing)",
        "TD004: no prefetch (see docs: data-checks#TD004)",
        # About an error's case (on_nonfinite="warn"): the error's own section.
        "tapeworks: 2 steps were non-finite. (see docs: troubleshooting#NonFiniteError)"]
    # Attributed to the caller's line, here.
    assert all(w.filename == __file__ for w in caught)
