"""Loads pages of the built guide in a real browser engine; prints what it saw, as JSON.

The engine is Chromium's, through Qt WebEngine (PyQt6-WebEngine, from PyPI, so
the suite needs nothing but pip; offscreen, no display). For each page: did
it load, what the page logged to its JavaScript console at warning level or
above, every image's natural width (0 when it did not load), and the code
blocks wider than their box (a reader would scroll sideways). On the
first page (the home page) also: where the one-line change's code block
sits in a 1280x800 window, and what the guide's search answers for each of
`--search` terms (the titles of the result entries).

    python tests/docs/browser.py http://127.0.0.1:PORT/ index.html faq/ ... \
        --search NaN resume int8

Run as its own process: Qt wants the main thread, and one QApplication.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Root in a container has no user namespace for Chromium's sandbox; the pages
# are the project's own, served on loopback.
os.environ.setdefault("QTWEBENGINE_DISABLE_SANDBOX", "1")
os.environ.setdefault("QTWEBENGINE_CHROMIUM_FLAGS",
                      "--disable-gpu --disable-background-networking --disable-component-update")

from PyQt6.QtCore import QTimer, QUrl  # noqa: E402
from PyQt6.QtWebEngineCore import QWebEnginePage  # noqa: E402
from PyQt6.QtWebEngineWidgets import QWebEngineView  # noqa: E402
from PyQt6.QtWidgets import QApplication  # noqa: E402

IMAGES = """JSON.stringify([Array.from(document.images).map(i => [i.getAttribute('src'),
    i.complete ? i.naturalWidth : 0]),
    Array.from(document.querySelectorAll('pre > code')).filter(
        c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent.slice(0, 60))])"""
# The home page's code block holding the change, and the window's height.
FIRST_SCREEN = """JSON.stringify((() => {
    const block = Array.from(document.querySelectorAll('pre')).find(
        p => p.textContent.includes('tapeworks.Trainer(model).fit('));
    const r = block ? block.getBoundingClientRect() : null;
    return {height: window.innerHeight, width: window.innerWidth,
            top: r ? r.top : null, bottom: r ? r.bottom : null};
})())"""
SEARCH = """(() => {
    const input = document.querySelector('input.md-search__input');
    input.focus();
    input.value = %s;
    input.dispatchEvent(new Event('focus'));
    input.dispatchEvent(new Event('keyup'));
    input.dispatchEvent(new Event('input'));
    return !!input;
})()"""
RESULTS = """JSON.stringify(Array.from(document.querySelectorAll(
    '.md-search-result__item .md-search-result__link')).map(
    a => [a.getAttribute('href'), (a.querySelector('h1, h2') || a).textContent.trim()]))"""


class Page(QWebEnginePage):
    def __init__(self, log):
        super().__init__()
        self.log = log

    def javaScriptConsoleMessage(self, level, message, line, source):
        if level != QWebEnginePage.JavaScriptConsoleMessageLevel.InfoMessageLevel:
            self.log.append(f"{source}:{line}: {message}")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("pages", nargs="+")
    parser.add_argument("--search", nargs="*", default=[])
    args = parser.parse_args(argv)

    app = QApplication([sys.argv[0]])
    view = QWebEngineView()
    console = []
    page = Page(console)
    view.setPage(page)
    view.resize(1280, 800)
    view.show()
    report = {"pages": {}, "search": {}, "first_screen": None}
    queue = list(args.pages)
    searches = list(args.search)

    def after(ms, fn):
        QTimer.singleShot(ms, fn)

    def next_page():
        if not queue:
            return search_next() if searches else app.quit()
        path = queue.pop(0)
        entry = report["pages"][path] = {"loaded": None, "console": [], "images": [],
                                         "scrolling_code": []}
        console.clear()

        def finished(ok):
            page.loadFinished.disconnect(finished)
            entry["loaded"] = bool(ok)
            # Images and scripts finish after the document: wait a little.
            after(400, lambda: page.runJavaScript(IMAGES, lambda r: images(r)))

        def images(result):
            entry["images"], entry["scrolling_code"] = json.loads(result or "[[], []]")
            if path == args.pages[0]:
                page.runJavaScript(FIRST_SCREEN, lambda r: first_screen(r))
            else:
                done()

        def first_screen(result):
            report["first_screen"] = json.loads(result or "null")
            done()

        def done():
            entry["console"] = list(console)
            next_page()

        page.loadFinished.connect(finished)
        page.load(QUrl(args.base + path))

    def search_next():
        term = searches.pop(0)

        def loaded(ok):
            page.loadFinished.disconnect(loaded)
            # The search index loads in a web worker after the page.
            after(1500, lambda: page.runJavaScript(SEARCH % json.dumps(term),
                                                   lambda _: after(1500, read)))

        def read():
            page.runJavaScript(RESULTS, lambda r: store(r))

        def store(result):
            report["search"][term] = json.loads(result or "[]")
            if searches:
                search_next()
            else:
                app.quit()

        page.loadFinished.connect(loaded)
        page.load(QUrl(args.base + args.pages[0]))

    after(0, next_page)
    after(240_000, app.quit)           # never hang the suite
    app.exec()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
