"""The Python code blocks of README.md and docs/*.md, as the docs tests run them.

A page's runnable blocks run in order in one namespace, as a reader would paste
them: a block may use what an earlier block of the same page defined. Blocks
are written at tiny sizes in the first place (a few hundred samples, an epoch
or two), so what runs is what the reader sees. A block that is not meant to run
carries a visible title on its fence, which the site shows above the block:

    ```python title="Not run: <why>"

On GitHub, where fence titles are not shown, README.md says so in the text.
"""

import pathlib
import re
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOT_RUN = 'title="Not run'
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>.*)$")


def pages():
    """README.md and every guide page, the design notes included."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_blocks(path):
    """[(first line number, info string, code)] of every fenced block in the page."""
    blocks, inside, start, info, body = [], False, 0, "", []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = FENCE.match(line)
        if match and not inside:
            inside, start, info, body = True, number + 1, match["info"].strip(), []
        elif match and inside and not match["info"].strip():
            blocks.append((start, info, textwrap.dedent("\n".join(body))))
            inside = False
        elif inside:
            body.append(line)
    return blocks


def python_blocks(path):
    """[(line, code)] of the page's Python blocks that are meant to run."""
    return [(line, code) for line, info, code in code_blocks(path)
            if info.split(" ")[0] == "python" and NOT_RUN not in info]


def not_run_blocks(path):
    """[(line, info)] of the page's Python blocks marked as not run."""
    return [(line, info) for line, info, _ in code_blocks(path)
            if info.split(" ")[0] == "python" and NOT_RUN in info]


def run_page(path, namespace=None):
    """Executes the page's runnable Python blocks in order, in one namespace.

    A failure names the page and the block's first line: the traceback's
    file name is `README.md:31` (page and the block's first line), its line
    numbers the block's own.
    """
    namespace = {"__name__": "__docs__"} if namespace is None else namespace
    for line, code in python_blocks(path):
        name = f"{path.name}:{line}"
        exec(compile(code, name, "exec"), namespace)
    return namespace
