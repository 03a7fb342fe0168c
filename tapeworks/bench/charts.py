"""A report's chart as a PNG, and `tapeworks bench --redraw`: matplotlib only.

Apart from the harness so that redrawing charts starts no TensorFlow.
"""

import json
import os


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
