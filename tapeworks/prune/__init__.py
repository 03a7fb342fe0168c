"""Magnitude pruning for Keras 3 models trained with `tapeworks.Trainer`.

`Pruning` (masks in variables, applied in the compiled step after each
update), its schedules `ConstantSparsity` and `PolynomialDecay`, and
`Pruning.strip` before export. See `tapeworks/prune/pruning.py`.
"""

from tapeworks.prune.pruning import Pruning, two_of_four_mask
from tapeworks.prune.schedule import ConstantSparsity, PolynomialDecay

__all__ = ["ConstantSparsity", "PolynomialDecay", "Pruning", "two_of_four_mask"]
