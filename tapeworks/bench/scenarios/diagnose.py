"""Scenario `diagnose`: what the per-step checks and the gradient monitor cost.

The same MLP trained with no checks (`on_nonfinite=None,
dead_gradient_steps=None`), with the defaults (`on_nonfinite="raise"`: the
loss and every gradient checked in the graph, a bad step's update withheld,
the loop able to stop after it; and the dead-gradient count), and with the
defaults plus `monitor_every=100`, alternating, on the `loops` small and
large MLPs. The checks twice: each trainer with "auto" (what a user gets: the
checks' cost is part of what "auto" measures, so it may pick another mode),
and all in the mode "auto" picked without them (the cost alone). Targets: the
checks at most 2%, the monitor at most 5% more. One more fixed-mode approach
has no check but makes every update wait for all of the step's gradients, as
withholding a bad step's update must: the part of the checks' cost that is
that ordering rather than the checking; two more have each of the defaults'
checks alone (the non-finite check with nothing withheld, "warn"; the
dead-gradient sums), so the withholding's share is the rest.
"""

import keras
import tensorflow as tf

from tapeworks.bench.data import in_memory_dataset
from tapeworks.bench.scenarios.loops import QUICK_SIZES, SIZES, _data, _loss, build_mlp
from tapeworks.bench.timing import Approach, alternate, settle_trainer
from tapeworks.engine import Trainer
from tapeworks.engine.step import StepHooks


class WaitForAllGradients(StepHooks):
    """No check; each update starts only once every gradient of the step exists.

    Withholding a bad step's update needs a verdict on all gradients before
    any update starts: this measures that ordering alone, without the
    verdict or the conditional (the part of the checks' cost that is the
    ordering, on this machine, in this run).
    """

    def on_gradients(self, grads_and_vars):
        gradients = [g for g, _ in grads_and_vars]
        with tf.control_dependencies(gradients):
            return [(tf.identity(g), v) for g, v in grads_and_vars]


DESCRIPTION = ("overhead of the per-step checks (on_nonfinite=\"raise\", dead gradients) and "
               "of monitor_every=100, bench MLPs")
MONITOR_EVERY = 100
UNCHECKED = "no checks"
CHECKED = "defaults (raise + dead gradients)"
MONITORED = "defaults + monitor_every=100"
GATED = "no checks, each update waits for every gradient"
WARNED = "the non-finite check alone, nothing withheld (on_nonfinite=\"warn\")"
DEAD = "the dead-gradient sums alone (on_nonfinite=None)"
CHECKS = {"none": dict(on_nonfinite=None, dead_gradient_steps=None),
          "defaults": {},
          "monitored": dict(monitor_every=MONITOR_EVERY),
          "warned": dict(on_nonfinite="warn", dead_gradient_steps=None),
          "dead": dict(on_nonfinite=None)}


def run(quick=False, repeats=5):
    rows = []
    for size in (QUICK_SIZES if quick else SIZES):
        x, y = _data(size, size.steps)
        dataset = in_memory_dataset((x, y), size.batch)
        samples = size.steps * size.batch
        # The mode "auto" settles on without the check, then fixed for both.
        probe = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), _loss(),
                        plan_cache=False, **CHECKS["none"])
        # A shorter settling fit for the quick (test) run.
        settle_seconds = 2.0 if quick else 20.0
        settle_trainer(probe, dataset, long_fit_seconds=settle_seconds)
        mode = dict(jit_compile=probe.jit_compile, steps_per_call=probe.steps_per_call)

        def trained(checks, name, fixed):
            fixed_mode = dict(mode) if fixed else {}
            if fixed and checks == "monitored":
                # Steps per call are capped at monitor_every.
                fixed_mode["steps_per_call"] = min(mode["steps_per_call"], MONITOR_EVERY)
            trainer = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), _loss(),
                              plan_cache=False, **CHECKS["none" if checks == "gated" else checks],
                              **fixed_mode)
            if checks == "gated":
                trainer.hooks = WaitForAllGradients()
            return Approach(name, lambda: (trainer.fit(dataset, verbose=0), samples)[1],
                            setup=lambda: settle_trainer(trainer, dataset,
                                                         long_fit_seconds=settle_seconds))

        fixed = f" [fixed {mode['jit_compile']}/{mode['steps_per_call']}]"
        names = {"base": UNCHECKED + " [auto]", "checked": CHECKED + " [auto]",
                 "base_fixed": UNCHECKED + fixed, "checked_fixed": CHECKED + fixed,
                 "monitored_fixed": MONITORED + fixed, "gated_fixed": GATED + fixed,
                 "warned_fixed": WARNED + fixed, "dead_fixed": DEAD + fixed}
        results = alternate([trained("none", names["base"], False),
                             trained("defaults", names["checked"], False),
                             trained("none", names["base_fixed"], True),
                             trained("defaults", names["checked_fixed"], True),
                             trained("monitored", names["monitored_fixed"], True),
                             trained("gated", names["gated_fixed"], True),
                             trained("warned", names["warned_fixed"], True),
                             trained("dead", names["dead_fixed"], True)], repeats)
        # The monitor against the defaults it adds to; the checks against none.
        baseline = {names["base"]: names["base"], names["checked"]: names["base"],
                    names["base_fixed"]: names["base_fixed"],
                    names["checked_fixed"]: names["base_fixed"],
                    names["monitored_fixed"]: names["checked_fixed"],
                    names["gated_fixed"]: names["base_fixed"],
                    names["warned_fixed"]: names["base_fixed"],
                    names["dead_fixed"]: names["base_fixed"]}
        for name, result in results.items():
            base = results[baseline[name]]["samples_per_s"]
            rows.append({"model": size.name, "approach": name,
                         "samples_per_s": result["samples_per_s"],
                         "baseline": baseline[name],
                         "vs_baseline": result["samples_per_s"] / base,
                         "overhead_percent": 100 * (base / result["samples_per_s"] - 1),
                         "repeats": result["runs"], "notes": result["notes"],
                         "group": size.name})
    return {
        "columns": [("model", "model"), ("approach", "approach"),
                    ("samples_per_s", "samples/s"), ("baseline", "compared with"),
                    ("vs_baseline", "x baseline"), ("overhead_percent", "overhead %")],
        "rows": rows,
        "facts": {"target": "the default checks cost at most 2% of step time; "
                            "monitor_every=100 at most 5% more",
                  "ordering": "'" + GATED + "': no check, but every update waits for all "
                              "of the step's gradients (a StepHooks control dependency): the "
                              "part of the checks' cost that is ordering, not checking",
                  "parts": "'" + WARNED + "' and '" + DEAD + "': the defaults' two checks "
                           "each alone; the rest of the defaults' cost is withholding a bad "
                           "step's update (a tf.cond on the step's verdict)",
                  "modes": "[auto]: each trainer settles by itself (the checks' cost is part of "
                           "what auto measures); [fixed J/N]: all in the mode auto settled "
                           "on without the checks"},
        "chart": {"group": "group", "bar": "approach", "value": "vs_baseline",
                  "label": "throughput relative to its baseline"},
    }
