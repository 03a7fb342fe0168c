"""Benchmark scenarios; each module has a `DESCRIPTION` and `run(quick, repeats[, out_dir])`."""

import ast
import os

# The order `tapeworks bench` runs them in (and `--list` lists them).
ORDER = ("loops", "accumulate", "precision", "gan", "input", "lint", "autotune", "wallclock",
         "diagnose", "bugs", "checkpoint", "export", "prune", "serve", "distribute",
         "examples")


def descriptions():
    """`{name: DESCRIPTION}` in `ORDER`, read from the modules' source, not imported.

    Importing a scenario starts TensorFlow (seconds); listing them, or
    refusing an unknown name, needs only these strings.
    """
    found = {}
    for name in ORDER:
        path = os.path.join(os.path.dirname(__file__), f"{name}.py")
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        found[name] = next(ast.literal_eval(node.value) for node in tree.body
                           if isinstance(node, ast.Assign)
                           and any(getattr(t, "id", None) == "DESCRIPTION" for t in node.targets))
    return found
