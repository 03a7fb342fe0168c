"""The guide builds without a warning, and every code a message points to has its anchor."""

import re
import subprocess
import sys

import pytest

from tapeworks.data.pipeline_check import CATEGORIES
from tapeworks.docs_links import PAGES, docs_anchor, see_docs
from tapeworks.lint.rules import PARSE_ERROR, RULES
from tests.docs.examples import ROOT


def anchors(page):
    """The explicit anchors (`{#CODE}`) of docs/<page>.md."""
    return set(re.findall(r"\{#([A-Za-z0-9_-]+)\}", (ROOT / "docs" / f"{page}.md").read_text()))


@pytest.mark.parametrize("code", [*CATEGORIES, *RULES, PARSE_ERROR])
def test_every_code_has_its_anchor(code):
    page, anchor = docs_anchor(code).split("#")
    assert anchor in anchors(page), f"docs/{page}.md has no {{#{code}}} anchor"


def test_see_docs_format():
    assert see_docs("TD004") == "see docs: data-checks#TD004"
    assert see_docs("TW112") == "see docs: lint-rules#TW112"
    assert set(PAGES) == {"TD", "TW"}
    with pytest.raises(ValueError, match="No guide page documents the code 'XX001'"):
        docs_anchor("XX001")


def test_messages_carry_the_pointer():
    from tapeworks.lint import check_source

    (finding,) = check_source("import tensorflow as tf\n@tf.function\ndef f(x):\n"
                              "    print(x)\n    return x\n", "f.py")
    assert finding.as_text().endswith(f"({see_docs(finding.code)})")
    assert RULES["TW103"].explain().endswith("Documented in the user guide: lint-rules#TW103.")


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    """A broken link, a missing anchor or an API object that is not there fails the build."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert (tmp_path / "site" / "data-checks" / "index.html").exists()
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "Trainer" in api and "export" in api
    # Every listed member, the inherited evaluate and predict included.
    for member in ("fit", "evaluate", "predict", "explain", "tuning"):
        assert f'id="tapeworks.Trainer.{member}"' in api, member
    # The README is not part of the site, so mkdocs does not check its links
    # into the guide: each must name a page, and an anchor that page has.
    links = re.findall(r"\]\(docs/([\w.-]+)\.md(?:#([\w-]+))?\)", (ROOT / "README.md").read_text())
    assert len(links) > 10
    for page, anchor in links:
        html = tmp_path / "site" / ("" if page == "index" else page) / "index.html"
        assert html.exists(), f"README.md links to docs/{page}.md, which is not in the site"
        if anchor:
            assert f'id="{anchor}"' in html.read_text(), (
                f"README.md links to docs/{page}.md#{anchor}, which has no such anchor")


def test_no_guide_page_is_over_3000_words():
    # A longer page is split by topic (troubleshooting, warnings and the
    # checks' cost; benchmarks by area; the design notes and module by module).
    pages = {p.name: len(p.read_text().split()) for p in sorted((ROOT / "docs").glob("*.md"))}
    assert len(pages) >= 35
    assert {name: words for name, words in pages.items() if words > 3000} == {}
