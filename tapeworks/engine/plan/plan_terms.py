"""The call planner's vocabulary: a planned call, a choice, and words for a mode.

Shared by the planner (`autotune`), the plan that hands out calls
(`call_plan`), the loop that runs them (`call_loop`) and `explain`.
"""

import dataclasses

FIRST, WARM, TIMED, CHOSEN, HOLD, RECHECK = (
    "first", "warm", "timed", "chosen", "hold", "recheck")


@dataclasses.dataclass(frozen=True)
class PlannedCall:
    """One call: XLA or not, how many steps, and what the call is for."""

    jit: object   # False, True or "update"
    steps: int
    kind: str = TIMED
    attempt: int = 0

    @property
    def first(self):
        return self.kind == FIRST


@dataclasses.dataclass
class Choice:
    jit_compile: object   # False, True or "update"
    steps_per_call: int
    reason: str
    # The rate the measurements predict for this choice (None where it was
    # not chosen by measuring: fixed, adopted from the cache, a fallback).
    expected_samples_per_s: float = None


def describe(mode):
    """Words for an execution mode, for logs and reports."""
    return {False: "tf.function", True: "XLA",
            "update": "tf.function with an XLA-fused update"}[mode]
