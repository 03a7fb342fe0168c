"""The engine: the Trainer, the compiled step, and the choice of how to run it."""

from tapeworks.engine.step import StepHooks
from tapeworks.engine.trainer import Trainer

__all__ = ["StepHooks", "Trainer"]
