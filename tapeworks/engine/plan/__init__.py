"""How the compiled step is run: the (mode, steps per call) choice and its measurements.

`autotune.py` (the CallPlanner) decides from timed calls
(`call_timing.py`, `plan_terms.py`, `recheck.py`); `plan_cache.py` keeps a
choice across runs; `graph_options.py` is how TensorFlow instantiates the
compiled functions; `measuring.py` runs the trainer's own loop as a trial
that leaves no trace (`diagnose_input`, `explain`).

`plan_cache` and `autotune` import no TensorFlow, so `tapeworks cache show`
answers without TensorFlow's import; this `__init__` imports nothing.

May import: the step, checks and inputs rooms, tapeworks.data, tapeworks.errors.
"""
