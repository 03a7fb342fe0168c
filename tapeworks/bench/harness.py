"""Runs a named scenario and writes its report: Markdown, JSON and a PNG chart."""

import dataclasses
import datetime
import importlib
import inspect
import json
import os
import platform

import tensorflow as tf


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


def _scenario(name):
    module = f"tapeworks.bench.scenarios.{name}"
    return Scenario(name, module, importlib.import_module(module).DESCRIPTION)


SCENARIOS = {s.name: s for s in (_scenario("loops"), _scenario("accumulate"),
                                 _scenario("precision"), _scenario("gan"), _scenario("input"),
                                 _scenario("lint"), _scenario("autotune"),
                                 _scenario("wallclock"), _scenario("diagnose"),
                                 _scenario("bugs"), _scenario("checkpoint"),
                                 _scenario("export"), _scenario("prune"), _scenario("serve"),
                                 _scenario("distribute"), _scenario("examples"))}


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


def write_chart(result, path):
    """The result's chart as a PNG: one panel per group, stacked, every label whole.

    Panels side by side crowded their labels and cut the last panel's axis
    label (the wallclock chart's three); stacked, each panel has the
    figure's width and a height in proportion to its bars.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chart = result["chart"]
    groups = list(dict.fromkeys(row[chart["group"]] for row in result["rows"]))
    # Rows without the charted value (a size, a save time) are in the table only.
    panels = [[r for r in result["rows"]
               if r[chart["group"]] == group and r.get(chart["value"]) is not None]
              for group in groups]
    heights = [max(len(rows), 1) * 0.32 + 0.9 for rows in panels]
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, group, rows in zip(axes[:, 0], groups, panels):
        names = [str(r[chart["bar"]]) for r in rows]
        values = [r[chart["value"]] for r in rows]
        # Bounds (the "ceiling" rows) are references, not contenders: they
        # do not set the scale, so the approaches stay readable; tapeworks'
        # own bars stand out.
        bound = ["ceiling" in n for n in names]
        compared = [v for v, b in zip(values, bound) if not b] or values or [1.0]
        limit = max(compared) * 1.25
        colors = ["#dddddd" if b else "#dd8452" if "tapeworks" in n else "#4c72b0"
                  for n, b in zip(names, bound)]
        ax.barh(range(len(rows)), [min(v, limit) for v in values], color=colors,
                hatch=None, edgecolor=["#888888" if b else "none" for b in bound])
        ax.set_xlim(0, limit)
        ax.set_yticks(range(len(rows)), names, fontsize=9)
        for label, name in zip(ax.get_yticklabels(), names):
            if "tapeworks" in name:
                label.set_fontweight("bold")
        ax.invert_yaxis()
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(str(group), fontsize=10, loc="left", weight="bold")
        ax.set_xlabel(chart["label"], fontsize=9)
        for i, (v, b) in enumerate(zip(values, bound)):
            if v > limit:
                ax.text(limit, i, f"{v:.2f}x (bound) ", va="center", ha="right", fontsize=8)
            else:
                ax.text(v, i, f" {v:.2f}x", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def redraw(folder):
    """Draws every chart in `folder` again from its JSON report (`tapeworks bench --redraw`).

    The figures are the recorded ones: only the picture changes. Returns the
    PNG paths written.
    """
    written = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            result = json.load(f)
        if isinstance(result, dict) and "chart" in result and "rows" in result:
            path = os.path.join(folder, name[:-len(".json")] + ".png")
            write_chart(result, path)
            written.append(path)
    return written
