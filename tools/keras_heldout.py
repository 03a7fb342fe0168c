"""Runs Keras' own tests twice, as Keras and through tapeworks, and lists what differs.

    python tools/keras_heldout.py callbacks trainers/trainer_test.py

Arguments are paths under the installed `keras/src`. Prints each run's
counts and the tests that pass on Keras but fail through tapeworks.
Results are informational (a held-out check), not part of the test suite:
Keras' suites take minutes and test Keras' internals too.
"""

import os
import re
import subprocess
import sys

import keras


def run(paths, through_tapeworks):
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
               "-o", "addopts=", "--continue-on-collection-errors", "--rootdir", os.path.dirname(paths[0]), *paths]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    if through_tapeworks:
        here = os.path.dirname(os.path.abspath(__file__))
        env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
        command[3:3] = ["-p", "keras_heldout_plugin"]
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    passed = set(re.findall(r"^PASSED (\S+)", result.stdout, re.M))
    failed = set(re.findall(r"^(?:FAILED|ERROR) (\S+)", result.stdout, re.M))
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-500:]
    return passed, failed, summary, result.stdout


def main(argv):
    root = os.path.join(os.path.dirname(keras.__file__), "src")
    paths = [os.path.join(root, p) for p in (argv or ["callbacks"])]
    keras_passed, _, keras_summary, _ = run(paths, through_tapeworks=False)
    tw_passed, tw_failed, tw_summary, output = run(paths, through_tapeworks=True)
    print(f"Keras:     {keras_summary}")
    print(f"tapeworks: {tw_summary}")
    lost = sorted(keras_passed - tw_passed)
    print(f"{len(keras_passed & tw_passed)} of {len(keras_passed)} tests that pass on Keras "
          "pass through tapeworks.")
    for name in lost:
        print(f"  differs: {name}")
        match = re.search(r"_+ " + re.escape(name.split("::")[-1]) + r" _+\n(.*?)(?=\n_{5,} |\Z)",
                          output, re.S)
        if match:
            error = [line for line in match.group(1).splitlines() if line.startswith("E ")]
            print("    " + "\n    ".join(error[:3]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
