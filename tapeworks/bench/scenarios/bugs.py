"""Scenario `bugs`: how many classic training bugs tapeworks names, with no debugging.

The held-out set is `tapeworks/bench/classic_bugs/`: each file a complete
script with one bug, written as users write them, and a `# named-if:` line
with the phrases a message must contain to name the cause (written with the
script, before it was run against tapeworks). Each script runs in a fresh
process under a small wrapper that records what the user would see as
diagnostics: warnings (Python's and logging's) and the exception that ended
it, if any; progress bars and traceback frames (which quote the user's own
code) do not count. A bug is named when every phrase is in those messages.
Not a timing: `--repeats` is not used.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

from tapeworks.bench import classic_bugs

DESCRIPTION = "held-out classic training bugs: how many tapeworks names without debugging"
QUICK = ("nan_in_features", "argmax_in_loss", "wrong_feature_count")
TIMEOUT_SECONDS = 300

# Runs a script as __main__ and writes {"warnings": [...], "error": "..."} to argv[2].
_WRAPPER = r"""
import json, logging, runpy, sys, traceback, warnings
said = {"warnings": [], "error": None}

def show(message, category, filename, lineno, file=None, line=None):
    said["warnings"].append(f"{category.__name__}: {message}")

warnings.showwarning = show
warnings.simplefilter("default")

class Keep(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            said["warnings"].append(f"log {record.name}: {record.getMessage()}")

for name in ("", "tensorflow", "tapeworks"):
    logging.getLogger(name).addHandler(Keep())
try:
    runpy.run_path(sys.argv[1], run_name="__main__")
except BaseException as error:
    said["error"] = f"{type(error).__name__}: {error}"
finally:
    with open(sys.argv[2], "w") as f:
        json.dump(said, f)
"""


def cases(quick=False):
    folder = os.path.dirname(classic_bugs.__file__)
    names = sorted(n[:-3] for n in os.listdir(folder)
                   if n.endswith(".py") and not n.startswith("_"))
    return [(n, os.path.join(folder, n + ".py")) for n in names if not quick or n in QUICK]


def criteria(path):
    """The script's docstring (the bug) and its `# named-if:` phrases."""
    text = open(path).read()
    bug = re.search(r'"""(.*?)"""', text, re.S).group(1).strip()
    phrases = re.search(r"^# named-if: (.+)$", text, re.M).group(1)
    return bug, [p.strip() for p in phrases.split("|")]


def run_case(path):
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "said.json")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TAPEWORKS_PLAN_CACHE="0")
        try:
            subprocess.run([sys.executable, "-c", _WRAPPER, path, out], cwd=folder, env=env,
                           capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            return {"warnings": [], "error": f"timed out after {TIMEOUT_SECONDS} s"}
        if not os.path.exists(out):
            return {"warnings": [], "error": "the process died before reporting"}
        with open(out) as f:
            return json.load(f)


def judge(said, phrases):
    messages = said["warnings"] + ([said["error"]] if said["error"] else [])
    text = "\n".join(messages).lower()
    named = all(p.lower() in text for p in phrases)
    # The message that names it (else the first one), shortened for the table.
    best = next((m for m in messages if all(p.lower() in m.lower() for p in phrases)),
                messages[0] if messages else "(nothing: training ran to the end)")
    return named, " ".join(best.split())[:220]


def run(quick=False, repeats=5):
    rows = []
    for name, path in cases(quick):
        bug, phrases = criteria(path)
        said = run_case(path)
        named, message = judge(said, phrases)
        rows.append({"bug": name, "what": bug, "needs": " + ".join(phrases),
                     "named": "yes" if named else "no",
                     "outcome": said["error"].split(":")[0] if said["error"] else (
                         f"{len(said['warnings'])} warning(s)" if said["warnings"]
                         else "silent"),
                     "said": message, "named_value": 1.0 if named else 0.0,
                     "group": "bugs", "repeats": []})
    named = sum(r["named"] == "yes" for r in rows)
    return {
        "columns": [("bug", "bug"), ("what", "the bug"), ("needs", "named if it says"),
                    ("named", "named"), ("outcome", "outcome"), ("said", "what it said")],
        "rows": rows,
        "facts": {"named": f"{named} of {len(rows)}",
                  "set": "tapeworks/bench/classic_bugs (held out: criteria written with the "
                         "scripts, before running them)"},
        "chart": {"group": "group", "bar": "bug", "value": "named_value",
                  "label": "named (1) or not (0)"},
    }
