"""The examples gallery (docs/examples.md) lists every example script there is."""

import os

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_every_example_and_corpus_script_is_in_the_gallery():
    with open(os.path.join(ROOT, "docs", "examples.md"), encoding="utf-8") as f:
        page = f.read()
    scripts = [f"examples/{n}" for n in os.listdir(os.path.join(ROOT, "examples"))
               if n.endswith(".py")]
    scripts += [f"{n}" for n in os.listdir(os.path.join(ROOT, "examples", "corpus"))
                if n.endswith(".py") and n != "corpus_fit.py"]
    assert len(scripts) >= 33
    assert [s for s in scripts if f"`{s}`" not in page] == []
