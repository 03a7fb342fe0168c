"""Errors raised by tapeworks.

Every error says what was wrong, what was expected, and how to fix it. They all
derive from `TapeworksError`, so callers can catch tapeworks' own complaints
without swallowing TensorFlow's.
"""


# The guide's page of errors (docs/troubleshooting.md): each of these classes has an
# anchor of its name there, and its messages end with a pointer to it, as ruff's
# and flake8's point to their rules. A subclass points to its nearest listed base.
ERRORS_PAGE = "troubleshooting"
DOCUMENTED_ERRORS = frozenset({
    "ConfigError", "KerasLoopInStepError", "MissingGradientError", "DataSpecError",
    "LossError", "NonFiniteError", "CheckpointError", "ExportError", "RegistryError",
    "ServingConfigError"})


class TapeworksError(Exception):
    """Base class of every error tapeworks raises on purpose.

    `message` is the text as raised; `str(error)` adds where the guide explains
    the error (`see docs: troubleshooting#DataSpecError`).
    """

    @property
    def message(self):
        return super().__str__()

    def __str__(self):
        text = self.message
        anchor = next((c.__name__ for c in type(self).__mro__
                       if c.__name__ in DOCUMENTED_ERRORS), None)
        if not text or anchor is None:
            return text
        return f"{text} (see docs: {ERRORS_PAGE}#{anchor})"


class ConfigError(TapeworksError, ValueError):
    """An argument to a tapeworks API has a value it cannot accept."""


class KerasLoopInStepError(TapeworksError, RuntimeError):
    """`model.predict()` (or another Keras loop) was called inside a training step."""


class MissingGradientError(TapeworksError, ValueError):
    """One or more trainable variables received no gradient."""


class DataSpecError(TapeworksError, ValueError):
    """The data's structure, shapes or dtypes do not fit the model."""


class LossError(TapeworksError, ValueError):
    """The loss is not a floating-point scalar."""


class TapeworksWarning(UserWarning):
    """Base class of the warnings tapeworks issues.

    Filter them with Python's `warnings` module, e.g.
    `warnings.filterwarnings("ignore", category=tapeworks.PerformanceWarning)`.
    """


class CorrectnessWarning(TapeworksWarning):
    """Something that changes what is learned: an unshuffled cache, batches reordered, a helper left trainable."""


class PerformanceWarning(TapeworksWarning):
    """Something that only costs time: a pipeline without prefetch, a sequential map."""


# The guide's page of warnings (docs/warnings.md), and where it explains a
# warning when its call names no section of its own: its category's section.
WARNINGS_PAGE = "warnings"
WARNING_SECTIONS = {"CorrectnessWarning": "CorrectnessWarning",
                    "PerformanceWarning": "CorrectnessWarning",
                    "TapeworksWarning": "warnings", "UserWarning": "warnings"}


def warn(message, category, section=None):
    """`warnings.warn`, attributed to the first caller outside tapeworks (the user's line).

    The message ends with where the guide explains it, as errors' do
    (`see docs: warnings#dead-gradients`): `section` is its anchor in
    docs/warnings.md, else its category's (`WARNING_SECTIONS`). A
    message that already points somewhere (a data check's finding code)
    keeps its own pointer.

    Python 3.12's `skip_file_prefixes` does the attribution; tapeworks supports 3.10+.
    """
    import os
    import sys
    import warnings

    if "see docs:" not in message:
        section = section or next((WARNING_SECTIONS[c.__name__] for c in category.__mro__
                                   if c.__name__ in WARNING_SECTIONS), "warnings")
        # A warning about an error's case (on_nonfinite="warn") points to the error's section.
        page = ERRORS_PAGE if section in DOCUMENTED_ERRORS else WARNINGS_PAGE
        message = f"{message} (see docs: {page}#{section})"
    package = os.path.dirname(os.path.abspath(__file__))
    # stacklevel 1 is this function's own line; 2 its caller, and so on.
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        level += 1
        frame = frame.f_back
    warnings.warn(message, category, stacklevel=level)
