"""Draws docs/images/engine.svg: the engine's layers and the data's path through `fit`.

The picture is made from the code, not drawn by hand: the layers are
`tests/test_structure.py`'s LAYERS (the import order the suite enforces), each
room is labelled with the first line of its package docstring, and the path
through `fit` is `FIT_PATH` below, each stage named with the module that runs
it (a test fails when one of those modules is gone). Its text stays text in
the SVG (`svg.fonttype: none`), so the test can read what the figure says and
compare it with the tree.

    python tools/engine_figure.py            # rewrites docs/images/engine.svg
    python tools/engine_figure.py OUT.svg
"""

import ast
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "docs", "images", "engine.svg")

# What `Trainer.fit` does with the data, in order, and the module of each stage.
FIT_PATH = [
    ("your x, y / tf.data / PyDataset", "engine.inputs.data_stage"),
    ("checked, batched tf.data", "engine.inputs.adapters"),
    ("variables built, checkpoint restored", "engine.training_state"),
    ("an epoch cut into planned calls", "engine.call_loop"),
    ("(mode, steps per call) measured", "engine.plan.autotune"),
    ("N steps in one graph call", "engine.step.step"),
    ("checks after each call", "engine.checks.nonfinite"),
    ("callbacks, History, progress", "engine.callback_bridge"),
]


def layers():
    """[(layer number, [module names])] from tests/test_structure.py, lowest first."""
    spec = importlib.util.spec_from_file_location(
        "test_structure", os.path.join(ROOT, "tests", "test_structure.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    grouped = {}
    for name, layer in module.LAYERS.items():
        if name.startswith("tapeworks.cli") or name == "tapeworks":
            continue
        grouped.setdefault(layer, []).append(name)
    return sorted(grouped.items())


def first_docstring_line(name):
    """The first line of a package's docstring, read from its file (nothing imported)."""
    spec = importlib.util.find_spec(name)
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    doc = ast.get_docstring(ast.parse(source)) or ""
    return doc.strip().split("\n")[0].rstrip(".")


def label(name):
    short = name.replace("tapeworks.engine.", "").replace("tapeworks.", "")
    return short + ("/" if is_room(name) else "")


def is_room(name):
    return name.count(".") == 2 and name.startswith("tapeworks.engine.") and os.path.isdir(
        os.path.join(ROOT, *name.split(".")))


def draw(out):
    sys.path.insert(0, ROOT)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "tapeworks",
                         "font.family": "DejaVu Sans"})
    rows = layers()
    height = 0.62
    fig, ax = plt.subplots(figsize=(12, 0.5 + height * len(rows)))
    ax.set_xlim(0, 12)
    ax.set_ylim(-0.2, height * len(rows) + 0.55)
    ax.axis("off")
    room_colour, front_colour, base_colour = "#d8e8f5", "#fde8c8", "#e6e6e6"
    for index, (layer, names) in enumerate(rows):
        y = index * height
        rooms = [n for n in names if is_room(n)]
        colour = room_colour if rooms else (front_colour if any(
            n.startswith("tapeworks.engine") for n in names) else base_colour)
        ax.add_patch(FancyBboxPatch((0.05, y + 0.06), 6.6, height - 0.12,
                                    boxstyle="round,pad=0.02", fc=colour, ec="#7a7a7a", lw=0.8))
        ax.text(0.18, y + height / 2, f"{layer}", va="center", ha="left", fontsize=9,
                color="#555555")
        text = "  ".join(label(n) for n in names)
        if rooms:
            ax.text(0.55, y + height * 0.66, text, va="center", ha="left", fontsize=9.5,
                    weight="bold")
            ax.text(0.55, y + height * 0.32, first_docstring_line(rooms[0]), va="center",
                    ha="left", fontsize=8, color="#333333")
        else:
            ax.text(0.55, y + height / 2, text, va="center", ha="left", fontsize=9.5)
    top = height * len(rows)
    ax.text(0.05, top + 0.25, "import order: a layer imports only the layers below it",
            fontsize=10, weight="bold")
    # The data's path through fit, on the right.
    step = (top - 0.1) / len(FIT_PATH)
    ax.text(7.1, top + 0.25, "the data's path through Trainer.fit", fontsize=10,
            weight="bold")
    for index, (what, module) in enumerate(FIT_PATH):
        y = top - (index + 1) * step
        ax.add_patch(FancyBboxPatch((7.1, y + 0.05), 4.8, step - 0.12,
                                    boxstyle="round,pad=0.02", fc="#eef6ea", ec="#7a7a7a",
                                    lw=0.8))
        ax.text(7.25, y + step / 2 - 0.02, what, va="center", fontsize=9.5)
        ax.text(11.8, y + step / 2 - 0.02, module.replace("engine.", ""), va="center",
                ha="right", fontsize=8, color="#555555", family="DejaVu Sans Mono")
        if index:
            ax.add_patch(FancyArrowPatch((9.5, y + step + 0.06), (9.5, y + step - 0.06),
                                         arrowstyle="-|>", mutation_scale=8, color="#555555"))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(draw(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT))
