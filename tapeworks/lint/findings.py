"""A finding, and which findings a user keeps: `# noqa` comments and rule selection."""

import dataclasses
import io
import re
import tokenize

from tapeworks.docs_links import see_docs


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    col: int
    code: str
    message: str

    def as_text(self):
        return (f"{self.path}:{self.line}:{self.col + 1}: {self.code} {self.message} "
                f"({see_docs(self.code)})")

    def as_dict(self):
        return dataclasses.asdict(self) | {"col": self.col + 1}


def noqa_codes(line):
    """None (no noqa), "all" (bare `# noqa`), or the set of codes a line suppresses."""
    match = re.search(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?",
                      line, re.IGNORECASE)
    if not match:
        return None
    if not match.group("codes"):
        return "all"
    return {c.upper() for c in re.split(r"[\s,]+", match.group("codes")) if c}


def comment_lines(source):
    """{line number: comment text}; comments only, so a '# noqa' in a string does not count."""
    comments = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                comments[token.start[0]] = token.string
    except (tokenize.TokenError, SyntaxError):
        pass
    return comments


def kept(findings, source, select=None, ignore=()):
    """The findings `select`/`ignore` (code prefixes) and the lines' `# noqa` leave."""
    # Tokenizing costs as much as parsing: only when a noqa could matter.
    comments = comment_lines(source) if findings and "noqa" in source.lower() else {}
    result = []
    for finding in findings:
        if select and not any(finding.code.startswith(s) for s in select):
            continue
        if any(finding.code.startswith(i) for i in ignore):
            continue
        codes = noqa_codes(comments.get(finding.line, ""))
        if codes == "all" or (codes and finding.code in codes):
            continue
        result.append(finding)
    return result
