"""`tapeworks launch`: real worker processes on loopback, their TF_CONFIG, failures and signals.

The workers here are small Python scripts (no TensorFlow): what is tested is
the launcher. Training under MultiWorkerMirroredStrategy belongs to the
distribute tests.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def launch(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "tapeworks.cli", "launch", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_each_worker_gets_its_tf_config_and_a_free_port_and_its_output_is_prefixed(tmp_path):
    worker = script(tmp_path, "worker.py", """
        import json, os, socket
        config = json.loads(os.environ["TF_CONFIG"])
        index = config["task"]["index"]
        host, port = config["cluster"]["worker"][index].split(":")
        with socket.socket() as s:
            s.bind((host, int(port)))   # its own address is free to bind
        print(json.dumps(config))
        print("done", index)
        """)
    result = launch("--workers", "3", "--", sys.executable, worker)
    assert result.returncode == 0, result.stdout + result.stderr
    configs = {}
    for line in result.stdout.splitlines():
        if line.startswith("[worker ") and "{" in line:
            prefix, text = line.split("] ", 1)
            configs[int(prefix[len("[worker "):])] = json.loads(text)
    assert sorted(configs) == [0, 1, 2]
    clusters = {tuple(c["cluster"]["worker"]) for c in configs.values()}
    assert len(clusters) == 1   # every worker sees the same cluster
    (cluster,) = clusters
    assert len(set(cluster)) == 3 and all(a.startswith("127.0.0.1:") for a in cluster)
    assert [configs[i]["task"] for i in range(3)] == [
        {"type": "worker", "index": i} for i in range(3)]
    for i in range(3):
        assert f"[worker {i}] done {i}" in result.stdout


def test_a_failing_worker_stops_the_others_and_its_status_is_the_launchers(tmp_path):
    marker = tmp_path / "terminated"
    worker = script(tmp_path, "worker.py", f"""
        import json, os, signal, sys, time
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        ready = {str(tmp_path)!r} + "/ready"
        if index == 1:
            # Fails once the others listen for SIGTERM.
            deadline = time.monotonic() + 60
            while not all(os.path.exists(ready + str(i)) for i in (0, 2)):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            print("failing", flush=True)
            sys.exit(3)
        def on_term(number, frame):
            open({str(marker)!r} + str(index), "w").write("SIGTERM")
            sys.exit(143)
        signal.signal(signal.SIGTERM, on_term)
        open(ready + str(index), "w").close()
        time.sleep(120)   # waits forever for a peer, as in a collective
        """)
    start = time.monotonic()
    result = launch("--workers", "3", "--", sys.executable, worker)
    assert time.monotonic() - start < 60
    assert result.returncode == 3
    assert "worker 1 exited with status 3; stopped worker(s) 0, 2" in result.stdout
    assert (tmp_path / "terminated0").read_text() == "SIGTERM"
    assert (tmp_path / "terminated2").read_text() == "SIGTERM"


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    worker = script(tmp_path, "worker.py", f"""
        import json, os, signal, sys, time
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        ready = {str(tmp_path)!r} + "/ready"
        if index == 0:
            deadline = time.monotonic() + 60
            while not os.path.exists(ready):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            sys.exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(ready, "w").close()
        time.sleep(120)
        """)
    start = time.monotonic()
    result = launch("--workers", "2", "--grace", "1", "--", sys.executable, worker)
    assert time.monotonic() - start < 60
    assert result.returncode == 1
    assert "worker 0 exited with status 1; stopped worker(s) 1" in result.stdout


def test_sigterm_to_the_launcher_reaches_every_worker_once(tmp_path):
    worker = script(tmp_path, "worker.py", f"""
        import json, os, signal, sys, time
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        seen = []
        def on_term(number, frame):
            seen.append(number)
        signal.signal(signal.SIGTERM, on_term)
        print("ready", flush=True)
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        # Worker 0 exits first (143); a second signal to worker 1 would arrive
        # while it still works (the launcher once sent one as it stopped the rest).
        time.sleep(0.2 if index == 0 else 1.5)
        open({str(tmp_path)!r} + f"/seen{{index}}", "w").write(str(len(seen)))
        sys.exit(143 if seen else 0)
        """)
    process = subprocess.Popen([sys.executable, "-m", "tapeworks.cli", "launch", "--workers",
                                "2", "--", sys.executable, worker], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    while sum("ready" in line for line in lines) < 2:
        line = process.stdout.readline()
        assert line, "".join(lines)
        lines.append(line)
    process.send_signal(signal.SIGTERM)
    out = process.communicate(timeout=60)[0]
    assert process.returncode == 143, "".join(lines) + out
    assert "SIGTERM: passed on to every worker" in out
    for index in range(2):
        assert (tmp_path / f"seen{index}").read_text() == "1"


@pytest.mark.parametrize("args, message", [
    (["--workers", "2"], "no command to launch"),
    (["--workers", "0", "--", "true"], "--workers must be an integer >= 1"),
])
def test_usage_errors_say_what_is_expected(args, message):
    result = launch(*args)
    assert result.returncode == 2
    assert message in result.stderr
