"""The examples corpus (examples/corpus) at tiny size, as real processes: each script trains with
Keras' fit and with tapeworks, gives the same History keys, and tapeworks shows no warning on
these scripts, which have nothing wrong. No timing is asserted."""

import subprocess
import sys

import pytest

from tapeworks.bench.scenarios import examples

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

# Four documented styles: a Sequential with class_weight, EarlyStopping and eleven metrics; a
# Functional model with residual adds and two metrics; dict inputs whose sorted keys are not
# the inputs' order, with per-output losses (tapeworks refused it once); CSV columns of shape
# (batch,) for Inputs of shape (1,), with string features (refused once too). A fifth, a
# subclassed model on arrays with validation_split (keras_subclass), is the quick scenario's
# script below, checked there the same way (both fits, same keys, no warning).
CLEAN_SCRIPTS = ["tf_imbalanced_data", "keras_functional", "keras_functional_multi_io",
                 "keras_structured_data_from_scratch"]


def test_the_corpus_has_at_least_thirty_scripts_each_with_its_source_and_licence():
    names = examples.corpus_scripts()
    assert len(names) >= 30
    for name in names:
        with open(f"{examples.corpus_dir()}/{name}.py") as f:
            header = f.read(3000)
        assert header.startswith("# Source: ") and "Licence: Apache-2.0" in header, name
        assert "Changed, and nothing else:" in header, name
        assert "corpus_fit.fit(" in header, name


@pytest.mark.parametrize("name", CLEAN_SCRIPTS)
def test_script_trains_with_both_fits_same_history_keys_no_warning(name, tmp_path):
    keras_run = examples.run_script(name, "keras", "tiny", str(tmp_path / "keras"))
    tapeworks_run = examples.run_script(name, "tapeworks", "tiny", str(tmp_path / "tapeworks"))
    assert keras_run["ok"], keras_run["stderr"]
    assert tapeworks_run["ok"], tapeworks_run["stderr"]
    assert (keras_run["fit"], tapeworks_run["fit"]) == ("keras", "tapeworks")
    assert "loss" in keras_run["history_keys"]
    assert tapeworks_run["history_keys"] == keras_run["history_keys"]
    assert tapeworks_run["warnings"] == []
    assert "Warning: tapeworks" not in tapeworks_run["stderr"]


def test_a_failed_run_gives_its_exception_line_and_the_tapeworks_warnings_it_showed(tmp_path):
    script = ("import warnings, tapeworks\n"
              "warnings.warn('tapeworks data check: TD001 late prefetch', "
              "tapeworks.PerformanceWarning)\n"
              "warnings.warn('not ours', UserWarning)\n"
              "raise ValueError('`x` was wrong.\\nExpected y. Fix: z.')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 1
    assert examples.first_error_line(done.stderr) == "ValueError: `x` was wrong."
    shown = examples.warnings_in(done.stderr)
    assert len(shown) == 1 and shown[0].startswith(
        "PerformanceWarning: tapeworks data check: TD001 late prefetch")


def test_quick_scenario_reports_runs_keys_losses_times_and_warnings(monkeypatch):
    monkeypatch.setenv("EXAMPLES_SCRIPTS", "keras_subclass")
    result = examples.run(quick=True, repeats=3)
    [row] = result["rows"]
    assert row["script"] == "keras_subclass"
    assert row["runs"] == "keras: yes, tapeworks cold: yes, tapeworks warm: yes"
    assert row["same_history_keys"] is True
    assert row["keras_loss"] > 0 and row["tapeworks_loss"] > 0
    assert row["cold_ratio"] > 0 and row["warm_ratio"] > 0
    assert row["warnings_shown"] == [] and row["warning_count"] == 0
    assert result["facts"]["scripts that run with both"] == "1 of 1"


def test_unknown_script_names_are_refused_with_the_corpus_names(monkeypatch):
    monkeypatch.setenv("EXAMPLES_SCRIPTS", "keras_subclass,no_such_script")
    with pytest.raises(ValueError, match="no_such_script, not in the corpus.*keras_subclass"):
        examples.run(quick=True, repeats=3)


def test_a_cold_only_run_reports_keras_and_cold_cells_alone(monkeypatch):
    monkeypatch.setenv("EXAMPLES_WARM", "0")
    assert examples.approaches() == ["keras", "tapeworks cold"]

    def result(seconds, loss):
        return {"ok": True, "fit_seconds": seconds, "final_loss": loss,
                "history_keys": ["loss"], "warnings": []}

    row = examples.summary("s", {"keras": [result(3.0, 1.0), result(5.0, 1.0)],
                                  "tapeworks cold": [result(2.0, 1.0), result(2.5, 1.0)]})
    assert row["runs"] == "keras: yes, tapeworks cold: yes"
    assert row["keras_s"] == 4.0 and row["cold_s"] == 2.25
    assert row["cold_ratio"] == 4.0 / 2.25 and row["cold_range"] == "1.50-2.00"
    assert "warm_s" not in row and "warm_ratio" not in row
    monkeypatch.delenv("EXAMPLES_WARM")
    assert examples.approaches() == examples.APPROACHES
