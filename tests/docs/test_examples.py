"""Every Python example of README.md and the guide runs, as written.

All pages run in this one process (one TensorFlow import) and on one xdist
worker (`xdist_group`). Each page gets a fresh folder as its working
directory, so what an example writes (checkpoints, exports) goes there.
"""

import warnings

import keras
import pytest

import tapeworks

from tests.docs import examples

# Pages whose examples take more than a few seconds (export and serve verify
# artefacts in fresh processes: about 40 s each on a 2-core machine).
SLOW_PAGES = {"README.md", "troubleshooting.md", "resume.md", "export.md", "serve.md",
              "diagnostics.md", "tasks.md", "distribute.md", "precision.md", "demo.md",
              "auto.md", "coming-from-keras.md"}


def page_params():
    params = []
    for path in examples.pages():
        marks = [pytest.mark.xdist_group("docs-examples")]
        if path.name in SLOW_PAGES:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(path, id=path.name, marks=marks))
    return params


@pytest.mark.parametrize("page", page_params())
def test_page_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        with warnings.catch_warnings():
            # An example that teaches a mistake would be a bad example: one
            # that trips a correctness check fails here.
            warnings.simplefilter("error", tapeworks.CorrectnessWarning)
            examples.run_page(page)
    finally:
        # A page may set a global precision policy or seed; the next starts clean.
        keras.mixed_precision.set_global_policy("float32")
        keras.backend.clear_session()


def test_blocks_are_found_and_marked():
    """The reader can tell what runs: every page's not-run Python blocks say so in their title."""
    readme = examples.ROOT / "README.md"
    assert examples.python_blocks(readme), "the README's tour must have runnable examples"
    for path in examples.pages():
        for line, info in examples.not_run_blocks(path):
            assert info.startswith('python title="Not run: ') and len(info) > 30, (
                f"{path.name}:{line}: a not-run block must say why in its title: {info}")


def test_the_fence_parser_reads_blocks_exactly(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n```python\na = 1\n```\n\n```bash\nls\n```\n"
                    '```python title="Not run: needs a GPU"\nb = 2\n```\n'
                    "  ```python\n  c = a + 1\n  ```\n")
    assert examples.python_blocks(page) == [(3, "a = 1"), (13, "c = a + 1")]
    assert examples.not_run_blocks(page) == [(10, 'python title="Not run: needs a GPU"')]
    assert examples.run_page(page)["c"] == 2
