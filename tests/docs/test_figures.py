"""The design notes' figure (docs/images/engine.svg) says what the tree is."""

import html
import importlib.util
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))

import engine_figure  # noqa: E402  (tools/ is not a package)


def _texts(path):
    with open(path, encoding="utf-8") as f:
        return [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", f.read())]


def test_the_committed_figure_is_the_one_the_code_draws(tmp_path):
    drawn = _texts(engine_figure.draw(str(tmp_path / "engine.svg")))
    assert "step/" in drawn and "resume/" in drawn and "trainer" in drawn
    # A new room, a moved module or a changed path fails here until the
    # figure is drawn again: `python tools/engine_figure.py`.
    assert _texts(engine_figure.DEFAULT_OUT) == drawn


def test_every_stage_of_the_path_through_fit_names_a_module_that_exists():
    for _, module in engine_figure.FIT_PATH:
        assert importlib.util.find_spec(f"tapeworks.{module}") is not None, module


def test_the_guides_benchmark_charts_are_the_recorded_ones():
    # docs/images/bench/ holds copies of benchmarks/*.png (the site is built
    # from docs/ alone): a chart drawn again must be copied again.
    bench = os.path.join(ROOT, "docs", "images", "bench")
    copies = sorted(os.listdir(bench))
    assert len(copies) >= 15
    for name in copies:
        with open(os.path.join(bench, name), "rb") as copy, \
                open(os.path.join(ROOT, "benchmarks", name), "rb") as recorded:
            assert copy.read() == recorded.read(), f"docs/images/bench/{name} is stale"
    shown = set()
    for page in os.listdir(os.path.join(ROOT, "docs")):
        if page.endswith(".md"):
            with open(os.path.join(ROOT, "docs", page), encoding="utf-8") as f:
                shown |= set(re.findall(r"\(images/bench/([\w-]+\.png)\)", f.read()))
    assert shown == set(copies)
