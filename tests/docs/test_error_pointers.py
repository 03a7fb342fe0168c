"""Every documented error class has its anchor in the guide, and its messages point there."""

import os
import re

from tapeworks import errors
from tapeworks.deploy.graph_ops import UnsafeGraphError
from tapeworks.engine.checkpoint_folder import CheckpointError

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
