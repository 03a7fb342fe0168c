"""Where the user guide documents each finding code: the `see docs: ...` pointers.

Every code a message carries (TD001, TW101, ...) has an anchor of that name
in one page of the guide (`docs/`), as ruff and flake8 point to their rules.
Messages name the page and anchor, not a URL: the guide is built from the
repository (`mkdocs build`) and may be served anywhere. A test checks that
every code has its anchor.
"""

# The code's prefix -> the guide page (docs/<page>.md) that documents it.
PAGES = {
    "TD": "data-checks",   # tapeworks.data.check: the tf.data pipeline checker
    "TW": "lint-rules",    # tapeworks lint: the static checker
}


def docs_anchor(code):
    """"data-checks#TD004" for the code "TD004": the guide page and the anchor of the code.

    Raises:
        ValueError: for a code whose prefix has no page in `PAGES`.
    """
    page = PAGES.get(code[:2])
    if page is None:
        raise ValueError(f"No guide page documents the code {code!r}. Expected a code "
                         f"starting with one of {', '.join(sorted(PAGES))}. Fix: add its "
                         "prefix and page to tapeworks.docs_links.PAGES.")
    return f"{page}#{code}"


def see_docs(code):
    """"see docs: data-checks#TD004": the pointer a message carries after its fix."""
    return f"see docs: {docs_anchor(code)}"
