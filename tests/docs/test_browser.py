"""The built guide, in a real browser: every page loads without a console error, every
image shows, no code scrolls sideways, search answers, and the home page's first screen
holds the one-line change.

The browser is Chromium's engine through Qt WebEngine (tests/docs/browser.py),
on the site `mkdocs build` writes, served over HTTP on loopback.
"""

import functools
import http.server
import json
import pathlib
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Each term, and a page (with its anchor, if any) its results must include.
SEARCHES = {"NaN": "troubleshooting/?h=nan#NonFiniteError", "resume": "resume/",
            "int8": "export/?h=int8#int8"}
# Pages that must show a picture, and how many at least.
PICTURES = {"": 2, "demo/": 1, "ARCHITECTURE/": 1, "benchmarks/": 1,
            "benchmarks-training/": 3, "benchmarks-deploy/": 2}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                            str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-4000:]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield out, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.mark.slow
def test_every_page_loads_shows_its_images_and_search_answers(site):
    folder, base = site
    pages = sorted(str(p.parent.relative_to(folder)) + "/" for p in folder.rglob("index.html"))
    pages = ["" if p == "./" else p for p in pages]
    assert "" in pages and "faq/" in pages and len(pages) >= 35
    pages.remove("")
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "docs" / "browser.py"), base, "",
                          *pages, "--search", *SEARCHES], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])

    seen = report["pages"]
    assert sorted(seen) == sorted(["", *pages])
    assert [p for p, e in seen.items() if not e["loaded"]] == []
    assert {p: e["console"] for p, e in seen.items() if e["console"]} == {}
    broken = {p: [src for src, width in e["images"] if not width] for p, e in seen.items()}
    assert {p: b for p, b in broken.items() if b} == {}
    scrolling = {p: e["scrolling_code"] for p, e in seen.items() if e["scrolling_code"]}
    assert scrolling == {}
    for page, least in PICTURES.items():
        assert len(seen[page]["images"]) >= least, (page, seen[page]["images"])

    for term, expected in SEARCHES.items():
        found = [href.split("/", 3)[-1] for href, _ in report["search"][term]]
        assert any(f.startswith(expected) for f in found), (term, found)

    # The home page's first screen, 1280x800, shows the whole before/after block.
    screen = report["first_screen"]
    assert (screen["width"], screen["height"]) == (1280, 800)
    assert 0 <= screen["top"] < screen["bottom"] <= 800, screen
