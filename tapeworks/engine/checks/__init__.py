"""What is watched while training runs, and the warnings and errors it gives.

The non-finite guard and its host-side policy (`nonfinite.py`) with the
rollback fast path (`rollback.py`), dead gradients (`gradient_health.py`),
the gradient monitor (`monitor.py`), retracing of the user's tf.functions,
sub-models called with `training=False`, the setup checks at a fit's start
(`fit_checks.py`, `loss_graph.py`, `value_checks.py`) and the number
attributes a step read while it was traced (`traced_numbers.py`). The
in-graph halves are handed to the step as hooks and variables; the step never
imports this room.

May import: the step room (`tapeworks.engine.step.step`), tapeworks.errors.
"""
