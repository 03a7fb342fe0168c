"""What one training step computes, and nothing about when or how often it runs.

The Task (models, updates, frozen helpers, losses) and its Keras-model forms
(`task.SupervisedTask`, `model_step.ModelStepTask`), the step itself
(`step.py`: forward under one tape -> losses -> per update: scale ->
gradients -> `updater.Updater`), precision plugins, loss weightings and
penalties, the replica rules (`replicas.py`, the identity on one device), the
step's branch and loop primitives (`control_flow.py`), the gradient
reductions the step shares with the checks (`sentinels.py`), captures, and
the refusals of what user code hands the step (`guards.py`: a Keras loop
inside the step, a loss that is not a scalar, missing gradients, data that
does not fit the model).

May import: tapeworks.errors, and TensorFlow/Keras. It is the first room:
no other engine room may be imported from here.
"""
