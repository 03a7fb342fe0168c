"""Does the server's hardening (issue 36) cost the batched small-request path? Paired rounds.

    git worktree add /work/wt-before 6510192     # main before the merge of branch 'srv'
    python benchmarks/serve-hardening-paired/paired.py /work/wt-before [rounds]

Both servers run at once on one registry (published by this tree's code),
each `tapeworks serve ROOT --max-batch-size 32 --max-queue 1024` as
`tapeworks bench serve` starts them; the load is bench serve's own (`_load`:
64 keep-alive clients, the small MLP, one instance a request), 8 s per turn,
the two servers alternated round by round, the order flipped every round.
Printed: each turn, then the medians and the median of the round-by-round
ratios (after / before).
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

from tapeworks.bench.scenarios import serve as bench_serve
from tapeworks.launch import free_ports

BEFORE = sys.argv[1]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
CLIENTS, SECONDS = 64, 8.0


def start(root, pythonpath):
    port = free_ports(1)[0]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    process = subprocess.Popen(
        [sys.executable, "-m", "tapeworks.cli", "serve", root, "--port", str(port),
         "--max-batch-size", "32", "--max-queue", "1024"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=root)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if r.status == 200:
                    return process, port
        except OSError:
            time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"the server with PYTHONPATH={pythonpath!r} did not start")


with tempfile.TemporaryDirectory() as root:
    bodies = bench_serve._export_models(root, quick=True)
    name, body = bodies["small MLP"]
    servers = {"before": start(root, BEFORE), "after": start(root, None)}
    try:
        for label, (_, port) in servers.items():   # warm-up: traces, first batches
            bench_serve._load(port, name, body, CLIENTS, 2.0)
        turns = {"before": [], "after": []}
        for index in range(ROUNDS):
            order = ("before", "after") if index % 2 == 0 else ("after", "before")
            for label in order:
                rate, p50, p99, errors = bench_serve._load(
                    servers[label][1], name, body, CLIENTS, SECONDS)
                turns[label].append((rate, p50, p99, errors))
                print(f"round {index} {label:6s} {rate:7.0f}/s p50 {p50:6.1f} ms "
                      f"p99 {p99:6.1f} ms errors {errors}", flush=True)
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(30)
    summary = {}
    for label, rows in turns.items():
        summary[label] = {"requests_per_s": float(np.median([r[0] for r in rows])),
                          "p99_ms": float(np.median([r[2] for r in rows]))}
    ratios = [a[0] / b[0] for a, b in zip(turns["after"], turns["before"])]
    summary["after_over_before"] = {"median": float(np.median(ratios)),
                                    "rounds": [round(r, 3) for r in ratios]}
    print(json.dumps(summary, indent=1))
