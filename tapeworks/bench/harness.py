"""Runs a named scenario and writes its report: Markdown, JSON and a PNG chart."""

import dataclasses
import datetime
import importlib
import inspect
import json
import os
import platform

import tensorflow as tf

from tapeworks.bench import scenarios
from tapeworks.bench.charts import write_chart


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    module: str
    description: str

    def run(self, quick, repeats, out_dir):
        run = importlib.import_module(self.module).run
        if "out_dir" in inspect.signature(run).parameters:
            return run(quick=quick, repeats=repeats, out_dir=out_dir)
        return run(quick=quick, repeats=repeats)


# A scenario's module is imported when it runs (some import much).
SCENARIOS = {name: Scenario(name, f"tapeworks.bench.scenarios.{name}", description)
             for name, description in scenarios.descriptions().items()}


def run_scenario(name, *, quick=False, repeats=5, out_dir="bench-results", command=""):
    """Runs one scenario; returns {"markdown", "files", "result"}."""
    result = SCENARIOS[name].run(quick, repeats, out_dir)
    result.update(
        scenario=name, quick=quick, repeats_per_approach=repeats, command=command,
        when=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        machine=machine_description(),
    )
    os.makedirs(out_dir, exist_ok=True)
    markdown = to_markdown(result)
    paths = [os.path.join(out_dir, f"{name}.{ext}") for ext in ("md", "json", "png")]
    with open(paths[0], "w") as f:
        f.write(markdown)
    with open(paths[1], "w") as f:
        json.dump(result, f, indent=2, default=str)
    write_chart(result, paths[2])
    paths += result.get("extra_files", [])
    return {"markdown": markdown, "files": paths, "result": result}


def machine_description():
    """The machine a run measured: figures from different CPUs are never compared blind."""
    from tapeworks import machine

    found = machine.gather()
    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "cpu": found.cpu,
        "cores_usable": found.cores,
        "cpu_flags": list(found.flags),
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
    }


def _format(value):
    if value is None:
        return ""   # a column that does not apply to this row
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.2f}"
    return str(value)


def to_markdown(result):
    columns = result["columns"]
    lines = [f"# `{result['scenario']}` benchmark", ""]
    if result.get("command"):
        lines += [f"Command: `{result['command']}`", ""]
    machine = result["machine"]
    cpu = machine["processor"]
    if machine.get("cpu"):
        cpu += f"; {machine['cpu']}"
    if "cpu_flags" in machine:   # reports written before the flags were recorded lack them
        cpu += "; CPU flags: " + (" ".join(machine["cpu_flags"]) or "none of avx2/avx512f/"
                                  "avx512_bf16/amx")
    lines += [f"Run {result['when']} on {machine['cpu_count']} CPU(s) ({cpu}), "
              f"GPUs: {machine['gpus'] or 'none'}, TensorFlow {machine['tensorflow']}. "
              + result.get("method", f"Median of {result['repeats_per_approach']} alternating "
                                     "timed repeats per approach after a warm-up; ratios are "
                                     "within this one run."), ""]
    for fact, value in result.get("facts", {}).items():
        lines.append(f"- {fact}: {_format(value)}")
    lines += ["", "| " + " | ".join(title for _, title in columns) + " |",
              "|" + "---|" * len(columns)]
    for row in result["rows"]:
        lines.append("| " + " | ".join(_format(row.get(key)) for key, _ in columns) + " |")
    notes = [(" / ".join(str(row[key]) for key, _ in columns[:2] if isinstance(row[key], str)),
              row["notes"])
             for row in result["rows"] if row.get("notes")]
    if notes:
        lines += ["", "Notes:"]
        for where, note in notes:
            text = ", ".join(f"{k}={v}" for k, v in note.items())
            lines.append(f"- {where}: {text}")
    return "\n".join(lines) + "\n"
