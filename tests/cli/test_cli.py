"""The `tapeworks` command line, run as a real process."""

import importlib
import json
import math
import os
import statistics
import subprocess
import sys

import pytest

from tapeworks.bench.scenarios import serve


def tapeworks(*args, cwd=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "tapeworks.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


def tapeworks_without_tensorflow(*args):
    """`tapeworks ARGS` in a fresh process that fails if the command imported TensorFlow."""
    probe = (f"import sys; from tapeworks import cli; code = cli.main({list(args)!r}); "
             "assert 'tensorflow' not in sys.modules, 'TensorFlow imported'; sys.exit(code)")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)


# The quick (smoke) runs of these scenarios share one `tapeworks bench`
# process (those that start processes of their own orchestrate them from it):
# a process costs about 11 s of imports on this project's slowest CI machine,
# and the suite has a 20-minute budget. Their tests run on one
# xdist worker (`xdist_group`), so the run happens once.
QUICK_TOGETHER = ["loops", "accumulate", "precision", "gan", "input", "diagnose", "checkpoint",
                  "lint", "autotune", "export", "prune", "serve", "distribute", "wallclock"]
quick_bench = pytest.mark.xdist_group("quick-bench")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("quick-bench")
    result = tapeworks("bench", *QUICK_TOGETHER, "--quick", "--repeats", "3", "--out", str(out),
                       timeout=1800)
    return result, out


def quick_report(quick_run, scenario):
    result, out = quick_run
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / f"{scenario}.json").read_text()), out


@pytest.mark.parametrize("verb", [[], ["demo"], ["bench"], ["export"]])
def test_help(verb):
    result = tapeworks(*verb, "--help")
    assert result.returncode == 0
    assert "usage: tapeworks" in result.stdout


def test_no_verb_is_a_usage_error():
    result = tapeworks()
    assert result.returncode == 2
    assert "VERB" in result.stderr


@pytest.mark.slow
def test_demo_quick(tmp_path):
    out = tmp_path / "demo"
    result = tapeworks("demo", "--quick", "--quiet", "--out", str(out),
                       "--json", str(tmp_path / "demo.json"))
    assert result.returncode == 0, result.stderr
    assert "PSNR" in result.stdout and "bicubic" in result.stdout
    assert (out / "comparison.png").stat().st_size > 10_000
    events = [f for _, _, files in os.walk(out / "logs") for f in files]
    assert any(f.startswith("events.out.tfevents") for f in events)
    summary = json.loads((tmp_path / "demo.json").read_text())
    # Even the quick run (one short epoch) must not be worse than bicubic.
    assert summary["psnr_network"] > summary["psnr_bicubic"]
    # One short epoch: the execution mode may still be being measured.
    assert summary["tuning"]["jit_compile"] in (True, False, "update", None)
    assert ("still measuring" in result.stdout) == (summary["tuning"]["jit_compile"] is None)


@pytest.mark.slow
def test_demo_quick_with_frozen_critic(tmp_path):
    result = tapeworks("demo", "--quick", "--quiet", "--perceptual", "0.01", "--out",
                       str(tmp_path), "--json", str(tmp_path / "demo.json"))
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "demo.json").read_text())
    assert summary["psnr_network"] > summary["psnr_bicubic"]


@pytest.mark.slow
@quick_bench
def test_bench_quick(quick_run):
    report, tmp_path = quick_report(quick_run, "loops")
    approaches = {row["approach"] for row in report["rows"]}
    assert approaches == {
        "tapeworks (defaults)", "keras fit (defaults)",
        "keras fit (jit_compile=True, steps_per_execution=32)",
        "hand-written tf.function loop", "eager loop", "train_on_batch loop",
        "ceiling: the step's matmuls alone (tf.function)",
        "ceiling: the step's matmuls alone (XLA)"}
    assert all(len(row["repeats"]) == 3 and row["samples_per_s"] > 0 for row in report["rows"])
    baseline = [r for r in report["rows"] if r["approach"] == "keras fit (defaults)"]
    assert all(r["vs_keras_fit"] == 1.0 for r in baseline)
    assert report["facts"]["float32 matmul peak (GFLOP/s)"] > 0
    assert len([f for f in report["facts"] if "% of the faster ceiling" in f]) == 2
    assert len([f for f in report["facts"] if "% of that bound" in f]) == 2
    assert report["facts"]["memory bandwidth, streaming (GB/s)"] > 0
    command = next(line for line in (tmp_path / "loops.md").read_text().splitlines()
                   if line.startswith("Command:"))
    assert "tapeworks bench loops " in command and " --quick" in command
    assert (tmp_path / "loops.png").stat().st_size > 5_000


def test_bench_rejects_unknown_scenario_and_few_repeats(tmp_path):
    result = tapeworks("bench", "nosuch", "--out", str(tmp_path))
    assert result.returncode == 2 and "unknown scenario" in result.stderr
    result = tapeworks("bench", "loops", "--repeats", "2", "--out", str(tmp_path))
    assert result.returncode == 2 and "--repeats must be >= 3" in result.stderr
    assert not (tmp_path / "loops.json").exists()


def test_bench_redraw_draws_each_chart_again_from_its_report(tmp_path):
    import shutil

    root = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
    shutil.copy(os.path.join(root, "wallclock.json"), tmp_path)
    (tmp_path / "notes.json").write_text("[1, 2]")        # not a report: left alone
    before = (tmp_path / "wallclock.json").read_bytes()
    # Redrawing needs matplotlib only: no TensorFlow starts.
    result = tapeworks_without_tensorflow("bench", "--redraw", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    png = (tmp_path / "wallclock.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert (tmp_path / "wallclock.json").read_bytes() == before      # the figures stay
    assert not (tmp_path / "notes.png").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    result = tapeworks("bench", "--redraw", str(empty))
    assert result.returncode == 2 and "no benchmark report" in result.stderr


def test_bench_list_reads_every_scenario_without_starting_tensorflow():
    import pkgutil

    from tapeworks.bench import scenarios

    # Listing reads each module's DESCRIPTION from its source: every module is listed.
    assert sorted(scenarios.ORDER) == sorted(
        m.name for m in pkgutil.iter_modules(scenarios.__path__))
    result = tapeworks_without_tensorflow("bench", "--list")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "I0000" not in result.stderr and "oneDNN" not in result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == [
        "loops", "accumulate", "precision", "gan", "input", "lint", "autotune", "wallclock",
        "diagnose", "bugs", "checkpoint", "export", "prune", "serve", "distribute", "examples"]
    from tapeworks.bench import harness

    for name, scenario in harness.SCENARIOS.items():
        module = importlib.import_module(scenario.module)
        assert scenario.description == module.DESCRIPTION and callable(module.run), name


@pytest.mark.slow
@pytest.mark.multiprocess
@quick_bench
def test_export_bench_quick(quick_run):
    report, tmp_path = quick_report(quick_run, "export")
    rows = {row["format"]: row for row in report["rows"]}
    assert sorted(rows) == ["tflite", "tflite int8"]
    assert all(row["size_kib"] > 0 and row["metric"] == "accuracy %" for row in rows.values())
    assert rows["tflite int8"]["vs_float_size"] < 1
    assert "digits int8 vs float32" in report["facts"]
    assert (tmp_path / "export.png").exists()


@pytest.mark.slow
@pytest.mark.multiprocess
@quick_bench
def test_serve_bench_quick_loads_both_servers_and_has_the_issue_36_measures(quick_run):
    report, tmp_path = quick_report(quick_run, "serve")
    rows = {row["batching"]: row for row in report["rows"]}
    assert sorted(rows) == ["ceiling: status GET, no model", "off", "on (max 32)"]
    assert all(r["errors"] == 0 and r["requests_per_s"] > 0 and len(r["repeats"]) == 3
               for r in rows.values())
    assert rows["off"]["vs_unbatched"] == 1.0
    assert (tmp_path / "serve.png").exists()
    # Issue 36's two measures: many clients, and /healthz during one big request.
    many = report["many_clients"]
    assert many["clients"] == serve.QUICK_MANY_CLIENTS and many["errors"] == 0
    assert many["p50_ms"] <= many["p99_ms"]
    big = report["health_during_big_request"]
    assert big["status"] == 200 and big["values"] == serve.QUICK_BIG_VALUES
    assert any(key.startswith("MLP, 32 clients") for key in report["facts"])
    assert "/healthz during one big request" in report["facts"]


@pytest.mark.slow
@pytest.mark.multiprocess
@quick_bench
def test_prune_bench_quick_compresses_the_pruned_file(quick_run):
    report, tmp_path = quick_report(quick_run, "prune")
    rows = {row["variant"]: row for row in report["rows"]}
    assert sorted(rows) == ["80% magnitude", "dense"]
    # Each kernel has round(0.8 n) zeros: 115 of the first conv's 144, so a hair under 80%.
    assert rows["dense"]["sparsity"] == 0
    assert rows["80% magnitude"]["sparsity"] == pytest.approx(80, abs=0.1)
    # Same file size (zeros are stored), smaller once compressed.
    assert rows["80% magnitude"]["size_kib"] == pytest.approx(rows["dense"]["size_kib"], rel=0.01)
    assert rows["80% magnitude"]["vs_dense_gzip"] < 0.5
    assert "Nothing is timed" in (tmp_path / "prune.md").read_text()


@pytest.mark.slow
@pytest.mark.multiprocess
@quick_bench
def test_distribute_bench_quick_times_every_approach(quick_run):
    report, tmp_path = quick_report(quick_run, "distribute")
    assert len(report["rows"]) == 5   # quick: the small MLP, tapeworks' 5 ways
    for row in report["rows"]:
        # A difference of two timings: noisy on a quick run (it may even dip
        # below 0 there), so only its presence is checked.
        assert len(row["repeats"]) == 3 and math.isfinite(row["ms_per_step"])
        assert (row["allreduced_kib"] == 0) == ("no strategy" in row["approach"])
    assert "overhead, not speed-up" in (tmp_path / "distribute.md").read_text()


@pytest.mark.slow
@quick_bench
@pytest.mark.parametrize("scenario", ["accumulate", "precision", "gan", "input", "diagnose",
                                      "checkpoint"])
def test_other_scenarios_quick(quick_run, scenario):
    report, tmp_path = quick_report(quick_run, scenario)
    assert report["rows"] and all(len(r["repeats"]) in (0, 3) for r in report["rows"])
    assert (tmp_path / f"{scenario}.png").exists()


@quick_bench
def test_lint_bench_quick_needs_no_network(quick_run):
    report, tmp_path = quick_report(quick_run, "lint")
    assert report["facts"]["files"] > 100
    assert (tmp_path / "lint-sample.md").exists()


@pytest.mark.slow
@quick_bench
def test_autotune_bench_pairs_every_loop_with_the_model_on_and_off(quick_run):
    rows = quick_report(quick_run, "autotune")[0]["rows"]
    names = [r["approach"] for r in rows]
    assert len(names) == 4 and {n.split("dataset ")[1] for n in names} == {
        "as built", "through without_autotuning"}
    for row in rows:
        assert row["slowest"] <= row["samples_per_s"] <= row["fastest"]
        if row["approach"].endswith("as built"):
            assert row["vs_as_built"] == 1.0


@pytest.mark.slow
@pytest.mark.multiprocess
@quick_bench
def test_wallclock_scenario_quick(quick_run):
    report, tmp_path = quick_report(quick_run, "wallclock")
    approaches = {row["approach"] for row in report["rows"]}
    assert len(approaches) == 4 and all(row["seconds"] > 0 for row in report["rows"])
    warm = next(r for r in report["rows"] if "warm" in r["approach"])
    assert warm["chose"].endswith("(cache)")
    # Round by round: the best fixed mode's process over this one's, in each round.
    fixed = next(r for r in report["rows"] if "fixed" in r["approach"])
    ratios = [f / s for f, s in zip(fixed["runs"], warm["runs"])]
    assert warm["best_fixed_paired"][0] == pytest.approx(statistics.median(ratios))
    assert min(ratios) <= warm["best_fixed_paired"][1] <= warm["best_fixed_paired"][2] \
        <= max(ratios)


def test_version():
    result = tapeworks("--version")
    assert result.returncode == 0 and result.stdout.startswith("tapeworks ")


def test_unknown_scenario_is_named_without_importing_tensorflow():
    result = subprocess.run([sys.executable, "-c",
                             "import sys; from tapeworks import cli; rc = cli.main(['bench', "
                             "'nosuch']); print(rc, 'tensorflow' in sys.modules)"],
                            capture_output=True, text=True)
    assert result.stdout.split() == ["2", "False"]
    assert "unknown scenario(s) nosuch" in result.stderr


@pytest.mark.multiprocess
def test_export_writes_a_verified_saved_model_and_refuses_a_taken_path(tmp_path, capsys):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,), name="features"), keras.layers.Dense(2)])
    model.save(tmp_path / "model.keras")
    result = tapeworks("export", str(tmp_path / "model.keras"), str(tmp_path / "served"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "saved_model artefact at" in result.stdout and "verified in a fresh process" \
        in result.stdout
    assert (tmp_path / "served" / "saved_model.pb").exists()
    # The refusal path in this process (a second process would import TensorFlow again).
    from tapeworks import cli

    assert cli.main(["export", str(tmp_path / "model.keras"), str(tmp_path / "served")]) == 1
    assert "tapeworks export:" in capsys.readouterr().err
