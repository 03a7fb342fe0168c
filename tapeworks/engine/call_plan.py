"""`CallPlan`: the (execution mode, steps per call) choice, announced, reused and stored.

`autotune.CallPlanner` measures and decides; this module is what a Trainer
does around it: creates it with the trainer's constraints, adopts a plan the
plan cache or a checkpoint holds, says what was chosen (once), and stores
the choice for later runs.
"""

import logging
import types

from tapeworks.engine import config as config_lib
from tapeworks.engine.plan import autotune, precision_trial
from tapeworks.engine.plan import plan_cache as plan_cache_lib
from tapeworks.engine.progress import announce
from tapeworks.engine.step import replicas
from tapeworks.errors import TapeworksWarning, warn

logger = logging.getLogger("tapeworks")


class CallPlan:
    """The planner of one Trainer and its life across fits and runs."""

    def __init__(self, config, task, precision, strategy, cache_setting):
        self.config = config
        self.task = task
        self.precision = precision
        self.strategy = strategy
        if cache_setting is False or (cache_setting is None
                                      and not plan_cache_lib.enabled_by_environment()):
            self.cache = None
        else:
            self.cache = plan_cache_lib.PlanCache(
                cache_setting if cache_setting not in (None, True) else None)
        self.planner = None       # autotune.CallPlanner, made at the first fit
        self.key = None           # the plan's fingerprint, once known
        self.description = None
        self.reason = None        # why the stored plan was chosen (the run that measured it)
        self.announced = None     # the choice last announced (and stored)

    # The settings' current values (`Trainer.jit_compile`, `.steps_per_call`) -----

    @property
    def mode(self):
        """The execution mode in use; None before the first fit while "auto" decides it."""
        if self.planner is not None:
            return self.planner.mode
        return self.config.jit_compile if self.config.jit_compile != "auto" else None

    @property
    def steps(self):
        if self.planner is not None:
            return self.planner.next_call().steps
        return self.config.steps_per_call if self.config.steps_per_call != "auto" else None

    def report(self):
        """What "auto" measured and chose (a dict), or None before the first fit."""
        return self.planner.report() if self.planner is not None else None

    # A fit ----------------------------------------------------------------------

    def start_fit(self):
        if self.planner is None:
            config = self.config
            self.planner = autotune.CallPlanner(
                config.jit_compile, config.steps_per_call,
                # Captures are copied on every k-th step into one buffer,
                # read after the call: calls of at most k steps.
                max_steps=config.capture_every,
                xla_available=not config.run_eagerly and not config.deterministic
                and not replicas.is_replicated(self.strategy)
                and config_lib.supports_xla(self.task.models),
                xla_order=xla_order(self.task, self.precision),
            )
        return self.planner

    def use_cache(self, element_spec, batch_size):
        """Adopts the plan a previous run stored for this fingerprint (once the batch is known)."""
        if self.cache is None or self.key is not None or not batch_size:
            return
        if not self.planner.tuning:
            return
        self.key, self.description = plan_cache_lib.fingerprint(
            self.config, self.task, self.precision, element_spec, batch_size)
        plan = self.cache.get(self.key)
        if plan is not None:
            self.planner.adopt(autotune.Choice(
                plan["jit_compile"], plan["steps_per_call"],
                f"from the plan cache ({plan['reason']})"), memory=plan.get("memory"))
            self.reason = plan["reason"]

    # Precision "auto" (`plan/precision_trial.py`) ------------------------------

    def stored_precision(self, element_spec, batch_size, candidates):
        """(key, the `PrecisionChoice` a previous run stored, or None); key None without a cache."""
        if self.cache is None or not batch_size:
            return None, None
        key, _ = plan_cache_lib.fingerprint(
            self.config, self.task, types.SimpleNamespace(policy="auto"), element_spec,
            batch_size)
        record = self.cache.get_record("precision", key)
        choice = precision_trial.PrecisionChoice.from_report(record, candidates)
        if record is not None and choice is None:
            warn(f"tapeworks: ignoring the plan cache's precision record {key} (not what a run "
                 "writes); precision is measured again and stored anew.", TapeworksWarning)
        return key, choice

    def choose_precision(self, train, fit_steps, open_trial, compiled, verbose):
        """precision="auto" on a CPU with native bfloat16: float32 or mixed bfloat16, measured.

        `train`: the fit's `PreparedData`; `fit_steps`: the steps this fit
        trains, or None where unknown; `open_trial()`: a `measuring.TrialRun`.
        A fit that cannot measure (too short; data that cannot be drawn again)
        trains in float32 and leaves the choice to a later fit; a measured
        choice is kept for the trainer's life, and stored in the plan cache.
        """
        precision = self.precision
        key, choice = self.stored_precision(compiled.state.element_spec, train.batch_size,
                                            precision.candidates)
        if choice is None:
            why = precision_trial.why_not_measured(
                train, fit_steps, self.config.run_eagerly,
                steps_before=int(compiled.state.counters.step.value()))
            if why is None and replicas.is_replicated(self.strategy):
                why = "several replicas: not measured"
            if why is not None:
                # Said once per trainer: a fit-per-epoch loop would repeat it with
                # a new step count at every fit.
                if not precision.waiting_said:
                    precision.waiting_said = True
                    announce(f"precision=float32 ({why})", verbose)
                precision.reason = why
                return
            with open_trial() as trial:
                choice = precision_trial.measure(trial, train, precision)
            if self.cache is not None and key is not None:
                self.cache.put_record("precision", key, choice.report())
        precision.decide(choice)
        for policy in precision.candidates:
            if policy != choice.policy:
                compiled.forget_precision(policy)
        announce(f"precision={choice.policy} ({choice.reason})", verbose)

    def announce_once(self, verbose):
        """Says what "auto" chose, once per choice (printed at verbose >= 1, logged); stores it."""
        choice = self.planner.choice
        if choice is None or choice is self.announced:
            return
        self.announced = choice
        if self.config.auto:
            line = (f"jit_compile={choice.jit_compile}, "
                    f"steps_per_call={choice.steps_per_call} ({choice.reason})")
            if verbose:
                print(f"tapeworks: {line}")
            logger.info("%s", line)
        if self.key is not None and not self.planner.from_cache:
            self.reason = choice.reason
            self._store()

    def end_fit(self):
        """At the end of a fit: the steps trained count toward trying a waiting XLA mode.

        Only plans with a mode still waiting are rewritten (see
        `CallPlanner.memory`); the others stay as they were stored.
        """
        if self.key is not None and self.planner.choice is not None \
                and self.planner.memory() is not None:
            self._store()
        if self.planner.tuning:
            # Measuring goes on in the next fit (epoch-by-epoch fit loops are
            # common): choosing now would rest on a partial schedule.
            logger.info("still measuring the execution mode and steps per call; "
                        "it continues in the next fit (see `trainer.tuning`)")

    def _store(self):
        """Writes this trainer's plan, with what a later run needs to go on deciding."""
        choice = self.planner.choice
        self.cache.put(self.key, choice.jit_compile, choice.steps_per_call, self.reason,
                       self.description, memory=self.planner.memory())

    # Across a resume -------------------------------------------------------------

    def saved_choice(self):
        """The choice a checkpoint keeps: `[jit_compile, steps_per_call]`, or None."""
        choice = self.planner.choice
        return [choice.jit_compile, choice.steps_per_call] if choice else None

    def adopt_checkpointed(self, saved):
        """A resumed run runs the checkpoint's choice, over a plan-cache one; fixed settings stay."""
        config = self.config
        if saved and config.auto:
            self.planner.adopt(autotune.Choice(
                saved[0] if config.jit_compile == "auto" else config.jit_compile,
                saved[1] if config.steps_per_call == "auto" else config.steps_per_call,
                "kept by the checkpoint, so the resumed run runs the same compiled step"))


def xla_order(task, precision):
    """The XLA modes "auto" tries, likelier winner first.

    Mixed precision gained most from XLA on the update alone (the forward and
    backward ran faster outside XLA); float32 from XLA on the whole step. A
    model's own `train_step` applies its update itself: only the whole step.
    """
    if task.own_train_step:
        return (True,)
    return ("update", True) if precision.policy != "float32" else (True, "update")
