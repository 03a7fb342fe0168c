"""The flake8 plugin: `flake8` and pre-commit users get the TW rules without a new tool.

flake8 applies `# noqa` and its own select/ignore; the plugin reports every finding.
"""

from tapeworks.docs_links import see_docs
from tapeworks.lint.checker import check_tree, too_deep


class TapeworksLint:
    name = "tapeworks"
    version = "0.1.0"

    def __init__(self, tree, filename="<stdin>"):
        self.tree = tree
        self.filename = filename

    def run(self):
        try:
            findings = check_tree(self.tree, self.filename)
        except RecursionError as error:
            findings = [too_deep(self.filename, "could not check", error)]
        for finding in findings:
            yield (finding.line, finding.col,
                   f"{finding.code} {finding.message} ({see_docs(finding.code)})", type(self))
