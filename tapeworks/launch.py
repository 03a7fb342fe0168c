"""`tapeworks launch --workers N -- python train.py ...`: N local workers with their TF_CONFIG.

`tf.distribute.MultiWorkerMirroredStrategy` (and `tf.distribute.cluster_resolver.
TFConfigClusterResolver`) read the cluster from the `TF_CONFIG` environment
variable: every worker's address and this process's own index. On a real
cluster the launcher of the platform sets it (a Kubeflow TFJob does, for every
worker; on plain hosts one sets it by hand). This launcher does the same on one
machine, for development and tests:

- picks N free ports on the loopback interface and starts the command N times,
  worker i with `TF_CONFIG={"cluster": {"worker": [...]}, "task": {"type":
  "worker", "index": i}}`;
- streams each worker's output (stdout and stderr) line by line with a
  `[worker i]` prefix;
- when a worker exits with a non-zero status, sends SIGTERM to the others (then
  SIGKILL after `grace` seconds) and exits with that worker's status: one failed
  worker never leaves the others waiting for it forever in a collective;
- forwards SIGTERM and SIGINT it receives to every worker once (the workers are
  in a session of their own, so a terminal's Ctrl-C reaches them only through
  the launcher, and only once: tapeworks reads a second SIGINT as "stop now");
  a second Ctrl-C kills them.

It is deliberately small: no restarts, no remote hosts. Those are the
cluster's job (the guide, docs/distribute.md, on `tapeworks launch`).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

HOST = "127.0.0.1"


def free_ports(count, host=HOST):
    """`count` distinct ports that were free on `host` a moment ago.

    All sockets are held open until every port is picked, so the ports are
    distinct; another process could still take one before the worker binds
    it (TensorFlow's own tests take the same chance through `portpicker`,
    which is not a dependency here for these few lines).
    """
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(addresses, index):
    """The `TF_CONFIG` of worker `index` in a cluster of `addresses` (host:port)."""
    return json.dumps({"cluster": {"worker": list(addresses)},
                       "task": {"type": "worker", "index": index}})


class Launcher:
    """Starts, watches and stops the workers of one `tapeworks launch`."""

    def __init__(self, command, workers, grace=10.0, out=None, host=HOST):
        if not command:
            raise ValueError("no command to launch. Expected e.g. "
                             "`tapeworks launch --workers 2 -- python train.py`.")
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"--workers must be an integer >= 1. Received: {workers!r}")
        self.command = list(command)
        self.workers = workers
        self.grace = grace
        self.out = out or sys.stdout
        self.addresses = [f"{host}:{port}" for port in free_ports(workers, host)]
        self.processes = []
        self._readers = []
        self._print_lock = threading.Lock()
        self._signalled = 0

    def _say(self, line):
        with self._print_lock:
            self.out.write(line)
            self.out.flush()

    def _stream(self, index, stream):
        for line in iter(stream.readline, ""):
            if not line.endswith("\n"):
                line += "\n"   # a last line without its newline
            self._say(f"[worker {index}] {line}")
        stream.close()

    def start(self):
        for index in range(self.workers):
            env = dict(os.environ, TF_CONFIG=tf_config(self.addresses, index),
                       PYTHONUNBUFFERED="1")
            process = subprocess.Popen(
                self.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace", bufsize=1, start_new_session=True)
            self.processes.append(process)
            reader = threading.Thread(target=self._stream, args=(index, process.stdout),
                                      daemon=True)
            reader.start()
            self._readers.append(reader)

    def _signal_all(self, number):
        for process in self.processes:
            if process.poll() is None:
                try:
                    process.send_signal(number)
                except ProcessLookupError:
                    pass

    def _stop_others(self):
        """SIGTERM to the workers still running; SIGKILL to those still there after `grace`.

        After a signal was passed on, the workers already have theirs: one that
        exits first (with 143) must not get the others a second SIGTERM while
        they save and exit (seen under load: a worker handled SIGTERM twice).
        """
        if not self._signalled:
            self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and any(p.poll() is None for p in self.processes):
            time.sleep(0.05)
        self._signal_all(signal.SIGKILL)
        for process in self.processes:
            process.wait()

    def _on_signal(self, number, frame):
        self._signalled += 1
        if self._signalled == 1:
            self._say(f"tapeworks launch: {signal.Signals(number).name}: passed on to every "
                      "worker (again to kill them)\n")
            self._signal_all(number)
        else:
            self._signal_all(signal.SIGKILL)

    def run(self):
        """Runs the workers to the end; returns the launcher's exit status."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGINT):
                previous[number] = signal.signal(number, self._on_signal)
        try:
            self.start()
            self._say(f"tapeworks launch: {self.workers} worker(s) on "
                      f"{', '.join(self.addresses)}: {' '.join(self.command)}\n")
            failed = None
            while failed is None and any(p.poll() is None for p in self.processes):
                for index, process in enumerate(self.processes):
                    if process.poll() not in (None, 0):
                        failed = index
                        break
                else:
                    time.sleep(0.05)
            if failed is None:
                failed = next((i for i, p in enumerate(self.processes) if p.returncode != 0),
                              None)
            if failed is not None:
                code = self.processes[failed].returncode
                running = [i for i, p in enumerate(self.processes) if p.poll() is None]
                self._stop_others()
                stopped = (f"; stopped worker(s) {', '.join(map(str, running))}"
                           if running else "")
                self._say(f"tapeworks launch: worker {failed} exited with status "
                          f"{_status(code)}{stopped}\n")
            for reader in self._readers:
                reader.join(timeout=5)
            if failed is not None:
                return _exit_code(self.processes[failed].returncode)
            return 0
        finally:
            for process in self.processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            for number, handler in previous.items():
                signal.signal(number, handler)


def _status(code):
    return f"{code}" if code >= 0 else f"{128 - code} (signal {signal.Signals(-code).name})"


def _exit_code(code):
    """A worker's status as a shell reports it: 128 + the signal for a killed one."""
    return code if code > 0 else 128 - code


def main(args):
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        launcher = Launcher(command, args.workers, grace=args.grace)
    except ValueError as error:
        print(f"tapeworks launch: {error}", file=sys.stderr)
        return 2
    return launcher.run()
