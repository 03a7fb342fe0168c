"""Scenario `examples`: real Keras scripts, unchanged but for their data, under Keras' fit and tapeworks'.

The corpus is `examples/corpus/` in the repository: TensorFlow tutorials and
Keras' own examples with their downloads swapped for synthetic stand-ins of
the same shapes and pipelines (each file's header says its source, licence
and exactly what changed). Every script trains with its one
`corpus_fit.fit(model, ...)` call, which is `model.fit(...)` or
`tapeworks.Trainer(model).fit(...)` with the same arguments as
`TAPEWORKS_CORPUS_FIT` says, and ends with one JSON line (History keys, final
loss, the wall time of the fit call, the tapeworks warnings shown).

Each measurement is a fresh Python process running one script as a user
would (`python script.py`). Per script, alternated within each round:

- Keras' `fit` (Keras keeps no cache between processes: one cell);
- tapeworks, cold: an empty plan cache and XLA cache of its own;
- tapeworks, warm: the caches a first, untimed tapeworks run of the same
  script left (left out, with that run, under `EXAMPLES_WARM=0`).

Reported per script: whether each runs (else the error's first line), the
same History keys or not, the final loss of each (medians), the wall time of
`fit` (medians of `repeats` processes) and Keras' over tapeworks', and the
warnings tapeworks showed (their text, each once).
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import tapeworks

DESCRIPTION = ("real scripts (TensorFlow tutorials, Keras examples; synthetic data) trained by "
               "Keras' fit and by tapeworks, fresh processes, cold and warm caches: runs, "
               "History keys, final loss, fit wall time, warnings shown")

QUICK_SCRIPTS = ["keras_subclass", "tf_text_classification", "tf_time_series_lstm"]
APPROACHES = ["keras", "tapeworks cold", "tapeworks warm"]
PROCESS_TIMEOUT_S = 900


def corpus_dir():
    """The corpus folder: `examples/corpus` beside the `tapeworks` package (a source checkout)."""
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
        tapeworks.__file__))), "examples", "corpus")
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"The examples corpus was not found at {folder}. Expected the repository's "
            "examples/corpus folder beside the tapeworks package. Fix: run `tapeworks bench "
            "examples` from a source checkout (pip install -e .), not an installed wheel.")
    return folder


def corpus_scripts():
    """The corpus' script names (without `.py`), sorted; `corpus_fit` is the switch, not a script."""
    return sorted(name[:-3] for name in os.listdir(corpus_dir())
                  if name.endswith(".py") and name != "corpus_fit.py")


def run_script(name, fit, size, cache_dir, timeout=PROCESS_TIMEOUT_S):
    """Runs one corpus script in a fresh process; returns what it reported.

    Args:
        name: the script's name without `.py` (one of `corpus_scripts()`).
        fit: "keras" or "tapeworks" (`TAPEWORKS_CORPUS_FIT`).
        size: "small" or "tiny" (`TAPEWORKS_CORPUS_SIZE`).
        cache_dir: `TAPEWORKS_CACHE_DIR` of the process (its plan and XLA caches).

    Returns:
        The script's JSON line as a dict plus "ok": True, or {"ok": False,
        "error": the exception's first line, "warnings": the tapeworks warnings
        its stderr shows}; both with "stderr" (its last 4,000 characters).
    """
    env = dict(os.environ, TAPEWORKS_CORPUS_FIT=fit, TAPEWORKS_CORPUS_SIZE=size,
               TAPEWORKS_CACHE_DIR=cache_dir, TAPEWORKS_PLAN_CACHE="1", TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_XLA_FLAGS", None)
    with tempfile.TemporaryDirectory() as scratch:   # files a script writes stay out of the repo
        try:
            done = subprocess.run([sys.executable, os.path.join(corpus_dir(), name + ".py")],
                                  capture_output=True, text=True, env=env, cwd=scratch,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"did not finish in {timeout} s", "warnings": [],
                    "stderr": ""}
    stderr = done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines and lines[-1].startswith("{"):
        return dict(json.loads(lines[-1]), ok=True, stderr=stderr)
    return {"ok": False, "error": first_error_line(done.stderr) or
            f"exit status {done.returncode} with no traceback", "warnings":
            warnings_in(done.stderr), "stderr": stderr}


def first_error_line(stderr):
    """The first line of the last traceback's exception ("ValueError: ..."), or ""."""
    if "Traceback (most recent call last):" not in stderr:
        return ""
    tail = stderr.rsplit("Traceback (most recent call last):", 1)[1].splitlines()
    return next((line for line in tail if line and not line[0].isspace()), "")


# A warning as Python shows it: "path:line: SomeWarning: message".
_SHOWN = re.compile(r"^\S.*?:\d+: (\w*Warning): (.*)$")
_TAPEWORKS_CATEGORIES = ("TapeworksWarning", "CorrectnessWarning", "PerformanceWarning")


def warnings_in(stderr):
    """The tapeworks warnings in a failed run's stderr (their first lines), each once."""
    found = []
    for line in stderr.splitlines():
        match = _SHOWN.match(line)
        if match and match.group(1) in _TAPEWORKS_CATEGORIES:
            text = f"{match.group(1)}: {match.group(2)}"
            if text not in found:
                found.append(text)
    return found


def _median_loss(results):
    """The median final loss of `results`, or None where a History has none to report."""
    losses = [r["final_loss"] for r in results if r.get("final_loss") is not None]
    return statistics.median(losses) if losses else None


def approaches():
    """The approaches timed: all three, or Keras and cold alone with `EXAMPLES_WARM=0`.

    Issue 53's targets are cold; on a slow machine the warm cells (and the
    untimed run that fills their caches) double a run's length.
    """
    warm = os.environ.get("EXAMPLES_WARM", "1").strip().lower() not in ("0", "off", "no")
    return list(APPROACHES) if warm else [a for a in APPROACHES if a != "tapeworks warm"]


def summary(name, runs):
    """One report row from a script's runs ({approach: [result, ...]}; warm may be absent)."""
    keras_runs, cold = runs["keras"], runs["tapeworks cold"]
    warm = runs.get("tapeworks warm", [])
    timed = [a for a in APPROACHES if a in runs]
    row = {"script": name, "group": "fit wall time, Keras / tapeworks cold",
           "same_history_keys": None}   # None: not compared (a run failed)
    failed = {a: next((r for r in runs[a] if not r["ok"]), None) for a in timed}
    row["runs"] = ", ".join(f"{a}: {'yes' if failed[a] is None else 'no'}" for a in timed)
    errors = {a: f["error"] for a, f in failed.items() if f is not None}
    shown = []
    for result in cold + warm:
        shown += [w for w in result.get("warnings", []) if w not in shown]
    row["warnings_shown"] = shown
    row["warning_count"] = len(shown)
    notes = {}
    if errors:
        notes.update({f"error ({a})": e for a, e in errors.items()})
    if shown:
        notes["warnings"] = " | ".join(shown)
    if notes:
        row["notes"] = notes
    if errors:
        return row
    row["same_history_keys"] = all(r["history_keys"] == keras_runs[0]["history_keys"]
                                   for r in keras_runs + cold + warm)
    row["history_keys"] = keras_runs[0]["history_keys"]
    if not row["same_history_keys"]:
        notes["tapeworks History keys"] = ", ".join(cold[0]["history_keys"])
        row["notes"] = notes
    row["keras_loss"] = _median_loss(keras_runs)
    row["tapeworks_loss"] = _median_loss(cold + warm)
    seconds = {a: [r["fit_seconds"] for r in runs[a]] for a in timed}
    row["runs_seconds"] = seconds
    row["keras_s"] = statistics.median(seconds["keras"])
    kinds = [a.split()[1] for a in timed if a != "keras"]
    for kind in kinds:
        row[f"{kind}_s"] = statistics.median(seconds[f"tapeworks {kind}"])
        row[f"{kind}_ratio"] = row["keras_s"] / row[f"{kind}_s"]
    # Round by round (the processes of a round ran close in time): the spread
    # of the ratio says how much of it the machine's noise could be.
    for kind in kinds:
        paired = [k / t for k, t in zip(seconds["keras"], seconds[f"tapeworks {kind}"])]
        row[f"{kind}_range"] = f"{min(paired):.2f}-{max(paired):.2f}"
    return row


def run(quick=False, repeats=3):
    # A subset for a shorter run: EXAMPLES_SCRIPTS="keras_subclass,tf_images_cnn"
    # (recorded in the report's facts).
    names = (os.environ["EXAMPLES_SCRIPTS"].split(",") if os.environ.get("EXAMPLES_SCRIPTS")
             else QUICK_SCRIPTS if quick else corpus_scripts())
    unknown = sorted(set(names) - set(corpus_scripts()))
    if unknown:
        raise ValueError(f"EXAMPLES_SCRIPTS names {', '.join(unknown)}, not in the corpus. "
                         f"Expected some of: {', '.join(corpus_scripts())}. Fix: correct the "
                         "names (without .py) or unset EXAMPLES_SCRIPTS.")
    size = "tiny" if quick else "small"
    rounds = 1 if quick else repeats   # quick (the tests' smoke run): not a measurement
    timed = approaches()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in names:
            warm = os.path.join(scratch, f"warm-{name}")
            if "tapeworks warm" in timed:
                run_script(name, "tapeworks", size, warm)   # fills the warm caches, untimed
            runs = {a: [] for a in timed}
            for round_index in range(rounds):
                shift = round_index % len(timed)
                for approach in timed[shift:] + timed[:shift]:
                    cache = warm if approach == "tapeworks warm" else os.path.join(
                        scratch, f"cold-{name}-{round_index}-{approach.replace(' ', '-')}")
                    runs[approach].append(run_script(
                        name, "keras" if approach == "keras" else "tapeworks", size, cache))
            rows.append(summary(name, runs))
    ran = [r for r in rows if "cold_ratio" in r]
    facts = {
        "scripts": ", ".join(names),
        "size": f"{size} (TAPEWORKS_CORPUS_SIZE)",
        "what a cell is": (
            f"median of {rounds} fresh process(es) per approach, alternated within each round; "
            "time of the fit call alone (tapeworks: Trainer creation, tracing, compiling and "
            "measuring included; imports and data excluded). Cold: empty plan and XLA caches "
            "of its own; warm: the caches an untimed first tapeworks run of the script left; "
            "Keras keeps no cache, so its one cell is compared with both. 'range' is the "
            "spread of Keras' time over tapeworks' round by round."),
        "scripts that run with both": f"{len(ran)} of {len(rows)}",
    }
    if "tapeworks warm" not in timed:
        facts["approaches"] = "Keras and tapeworks cold only (EXAMPLES_WARM=0): no warm cells"
    if ran:
        facts["median x Keras, cold"] = statistics.median(r["cold_ratio"] for r in ran)
        if "tapeworks warm" in timed:
            facts["median x Keras, warm"] = statistics.median(r["warm_ratio"] for r in ran)
        facts["lowest x Keras, cold"] = min(r["cold_ratio"] for r in ran)
    facts["tapeworks warnings shown (distinct, all scripts)"] = sum(
        r["warning_count"] for r in rows)
    return {
        "scenario": "examples",
        "description": DESCRIPTION,
        "rows": rows,
        "method": (f"Each approach: {rounds} fresh process(es) per script, alternated round by "
                   "round; medians per cell; ratios are within this one run."),
        "columns": [("script", "script"), ("same_history_keys", "same History keys"),
                    ("runs", "runs"),
                    ("keras_loss", "final loss, Keras"), ("tapeworks_loss", "final loss, tapeworks"),
                    ("keras_s", "fit s, Keras"), ("cold_s", "fit s, tapeworks cold"),
                    ("warm_s", "fit s, tapeworks warm"), ("cold_ratio", "x Keras, cold"),
                    ("cold_range", "cold range"), ("warm_ratio", "x Keras, warm"),
                    ("warm_range", "warm range"), ("warning_count", "tapeworks warnings")],
        "chart": {"group": "group", "bar": "script", "value": "cold_ratio",
                  "label": "Keras fit's time / tapeworks' (cold caches)"},
        "facts": facts,
    }


if __name__ == "__main__":
    # One script, one way, as the scenario runs it: python -m ... NAME keras|tapeworks [tiny]
    print(json.dumps(run_script(sys.argv[1], sys.argv[2],
                                sys.argv[3] if len(sys.argv) > 3 else "small",
                                tempfile.mkdtemp())))
