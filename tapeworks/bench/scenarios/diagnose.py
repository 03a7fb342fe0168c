"""Scenario `diagnose`: what the per-step checks cost.

The same MLP trained with `on_nonfinite=None` (no check) and with the
default `"raise"` (the loss and every gradient checked in the graph, a bad
step's update withheld, the loop able to stop after it), alternating, on the
`loops` small and large MLPs; twice: each trainer with "auto" (what a user
gets: the check's cost is part of what "auto" measures, so it may pick
another mode), and both in the mode "auto" picked without the check (the
check's cost alone). Target: at most 2% overhead.
"""

import keras

from tapeworks.bench.data import in_memory_dataset
from tapeworks.bench.scenarios.loops import QUICK_SIZES, SIZES, _data, _loss, build_mlp
from tapeworks.bench.timing import Approach, alternate, settle_trainer
from tapeworks.engine import Trainer

DESCRIPTION = "overhead of the per-step checks: on_nonfinite=\"raise\" vs no check, bench MLPs"
UNCHECKED = "on_nonfinite=None (no check)"
CHECKED = "on_nonfinite=\"raise\" (the default)"


def run(quick=False, repeats=5):
    rows = []
    for size in (QUICK_SIZES if quick else SIZES):
        x, y = _data(size, size.steps)
        dataset = in_memory_dataset((x, y), size.batch)
        samples = size.steps * size.batch
        # The mode "auto" settles on without the check, then fixed for both.
        probe = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), _loss(),
                        on_nonfinite=None, plan_cache=False)
        # A shorter settling fit for the quick (test) run.
        settle_seconds = 2.0 if quick else 20.0
        settle_trainer(probe, dataset, long_fit_seconds=settle_seconds)
        mode = dict(jit_compile=probe.jit_compile, steps_per_call=probe.steps_per_call)

        def trained(policy, name, fixed):
            trainer = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), _loss(),
                              on_nonfinite=policy, plan_cache=False, **(mode if fixed else {}))
            return Approach(name, lambda: (trainer.fit(dataset, verbose=0), samples)[1],
                            setup=lambda: settle_trainer(trainer, dataset,
                                                         long_fit_seconds=settle_seconds))

        fixed = f" [fixed {mode['jit_compile']}/{mode['steps_per_call']}]"
        names = {"base": UNCHECKED + " [auto]", "checked": CHECKED + " [auto]",
                 "base_fixed": UNCHECKED + fixed, "checked_fixed": CHECKED + fixed}
        results = alternate([trained(None, names["base"], False),
                             trained("raise", names["checked"], False),
                             trained(None, names["base_fixed"], True),
                             trained("raise", names["checked_fixed"], True)], repeats)
        for name, result in results.items():
            base = results[names["base_fixed" if "fixed" in name else "base"]]["samples_per_s"]
            rows.append({"model": size.name, "approach": name,
                         "samples_per_s": result["samples_per_s"],
                         "vs_unchecked": result["samples_per_s"] / base,
                         "overhead_percent": 100 * (base / result["samples_per_s"] - 1),
                         "repeats": result["runs"], "notes": result["notes"],
                         "group": size.name})
    return {
        "columns": [("model", "model"), ("approach", "approach"),
                    ("samples_per_s", "samples/s"), ("vs_unchecked", "x no check"),
                    ("overhead_percent", "overhead %")],
        "rows": rows,
        "facts": {"target": "on_nonfinite=\"raise\" costs at most 2% of step time",
                  "modes": "[auto]: each trainer settles by itself (the check's cost is part of "
                           "what auto measures); [fixed J/N]: both in the mode auto settled "
                           "on without the check"},
        "chart": {"group": "group", "bar": "approach", "value": "vs_unchecked",
                  "label": "throughput relative to no check"},
    }
