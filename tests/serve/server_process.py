"""A `tapeworks serve` process on a free loopback port, and a small HTTP client (urllib)."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

from tapeworks.launch import free_ports


class Server:
    def __init__(self, *args, grpc=False, timeout=90):
        ports = free_ports(2 if grpc else 1)
        self.port, self.grpc_port = ports[0], (ports[1] if grpc else None)
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        extra = ["--grpc-port", str(self.grpc_port)] if grpc else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tapeworks.cli", "serve", *args, "--port", str(self.port),
             *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError("server exited:\n" + self.process.stdout.read())
            try:
                status, _, _ = self.get("/healthz")
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("server not ready in time:\n" + self.process.stdout.read())
            time.sleep(0.2)

    def request(self, method, path, body=None, raw=None, headers=None):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null"), response.headers
        except urllib.error.HTTPError as error:
            text = error.read()
            try:
                payload = json.loads(text)
            except ValueError:
                payload = text.decode(errors="replace")
            return error.code, payload, error.headers

    def get(self, path):
        return self.request("GET", path)

    def post(self, path, body=None, raw=None):
        return self.request("POST", path, body=body, raw=raw)

    def text(self, path):
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return response.read().decode()

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.stdout.read() if self.process.stdout else ""
