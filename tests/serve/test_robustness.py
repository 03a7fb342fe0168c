"""`tapeworks serve` probed as an attacker and a clumsy user would, over real HTTP on loopback.

One server (TF Serving's flags: --model_name/--model_base_path, short timeouts) takes
non-finite numbers, deep nesting, invalid UTF-8, encoded names, a million-value request
while /healthz is asked, clients that hang up or stall; then a version copied in parts,
and a version replaced under the same number. A second server is stopped with SIGTERM
while requests are in flight.
"""

import json
import os
import shutil
import signal
import socket
import threading
import time
import urllib.request

import numpy as np
import pytest

from tests.serve.saved_models import scaled
from tests.serve.server_process import Server

pytestmark = [pytest.mark.multiprocess, pytest.mark.xdist_group("robustness")]
PREDICT = "/v1/models/scaled/versions/1:predict"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    base = tmp_path_factory.mktemp("models") / "scaled"
    scaled(str(base / "1"), 1)
    return base


@pytest.fixture(scope="module")
def server(base):
    running = Server("--model_name", "scaled", "--model_base_path", str(base),
                     "--max-body-mb", "32", "--poll-seconds", "0.2",
                     "--idle-timeout-seconds", "1", "--header-timeout-seconds", "1",
                     "--body-timeout-seconds", "2")
    yield running
    running.stop()


def raw_post(server, path, body):
    """(status, the response's text as sent)."""
    request = urllib.request.Request(server.url + path, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def until(condition, seconds=90):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def test_non_finite_numbers_in_and_out_as_tf_serving_writes_them(server):
    status, text = raw_post(server, PREDICT,
                            b'{"instances": [[NaN, Infinity, -Infinity], [1e39, -1e39, 4]]}')
    assert (status, text) == (200, '{"predictions": [[NaN,Infinity,-Infinity],'
                                   '[Infinity,-Infinity,6.0]]}')
    # Floats printed as TF Serving prints them: six digits, then max_digits10.
    status, text = raw_post(server, "/v1/models/scaled/versions/1:predict",
                            b'{"inputs": [[8999998, 0.1, 0.5]]}')
    assert (status, text) == (200, '{"outputs": [[9e+06,2.1,2.5]]}')


@pytest.mark.parametrize("depth", [900, 100000])
def test_deep_nesting_is_a_400_that_says_so(server, depth):
    status, body, _ = server.post(PREDICT, raw=b'{"instances": ' + b"[" * depth + b"]" * depth
                                  + b"}")
    assert status == 400 and f"nested {depth} levels deep" in body["error"]
    # Deep under a key TF Serving does not read: ignored, as TF Serving ignores it.
    status, body, _ = server.post(PREDICT, raw=b'{"instances": [[1, 1, 1]], "x": '
                                  + b"[" * depth + b"]" * depth + b"}")
    assert (status, body) == (200, {"predictions": [[3.0, 3.0, 3.0]]})


@pytest.mark.parametrize("raw", [b'{"signature_name": "\\ud800", "instances": [[1, 1, 1]]}',
                                 b'{"signature_name": "\xed\xa0\x80", "instances": [[1, 1, 1]]}',
                                 b'{"signature_name": "a\xffb", "instances": [[1, 1, 1]]}'])
def test_invalid_unicode_is_a_400(server, raw):
    status, body, _ = server.post(PREDICT, raw=raw)
    assert status == 400 and body["error"].startswith("JSON Parse error: ")


def test_an_encoded_model_name_is_decoded(server):
    status, body, _ = server.post("/v1/models/%2e%2e:predict", {"instances": [[1, 1, 1]]})
    assert (status, body) == (404, {"error": "Servable not found for request: Latest(..)"})
    status, body, _ = server.post("/v1/models/sc%61led/versions/1:predict",
                                  {"instances": [[1, 1, 1]]})
    assert (status, body) == (200, {"predictions": [[3.0, 3.0, 3.0]]})


def test_classify_reads_the_body_before_the_signature_method(server):
    # A predict signature: a malformed body gets the body's error, as TF Serving answers.
    status, body, _ = server.post("/v1/models/scaled:classify", {"instances": [1]})
    assert status == 400 and "key 'examples' is expected" in body["error"]
    status, body, _ = server.post("/v1/models/scaled:regress", {"examples": [{"x": 1.0}]})
    assert status == 400 and "Expected regression signature method_name" in body["error"]


def test_health_answers_while_a_million_value_request_is_in_flight(server):
    rows = np.random.default_rng(0).random((333334, 3)).astype(np.float32)
    body = json.dumps({"instances": np.round(rows, 3).tolist()}).encode()
    done = {}

    def big():
        done["big"] = raw_post(server, PREDICT, body)

    thread = threading.Thread(target=big)
    thread.start()
    answered = []
    while thread.is_alive():
        status, health, _ = server.get("/healthz")
        answered.append((status, "big" in done))
    thread.join()
    status, text = done["big"]
    assert status == 200 and len(json.loads(text)["predictions"]) == len(rows)
    # Several health checks were answered while the big request was still in flight.
    before = [s for s, big_done in answered if not big_done]
    assert len(before) >= 3 and set(before) == {200}


def _connect(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return sock


def test_a_client_hanging_up_mid_body_is_a_499_in_one_line(server):
    for _ in range(3):
        sock = _connect(server)
        sock.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"instances\": [[1, 1,")
        time.sleep(0.2)
        sock.close()
    until(lambda: 'code="499"' in server.text("/metrics"))
    metrics = server.text("/metrics")
    assert 'tapeworks_requests_total{code="499",method="predict",model="scaled"} 3.0' in metrics
    assert 'code="500"' not in metrics


def test_idle_and_stalled_connections_are_closed(server):
    idle = _connect(server)
    assert idle.recv(100) == b""          # closed by the server: nothing was ever sent
    stalled = _connect(server)
    stalled.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\n")
    assert stalled.recv(100) == b""       # headers never finished
    slow_body = _connect(server)
    slow_body.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: 100\r\n\r\n{")
    answer = b""
    while b"}" not in answer:   # the status line and headers, then the JSON body
        chunk = slow_body.recv(4096)
        if not chunk:
            break
        answer += chunk
    answer = answer.decode()
    assert answer.startswith("HTTP/1.1 408") and "was not received within 2 s" in answer
    for sock in (idle, stalled, slow_body):
        sock.close()


def test_a_version_copied_in_parts_loads_once_whole_and_health_says_degraded(
        server, base, tmp_path):
    source = scaled(str(tmp_path / "k3"), 3)
    target = base / "2"
    target.mkdir()
    shutil.copy(os.path.join(source, "saved_model.pb"), target / "saved_model.pb")

    def failed():
        status = server.get("/v1/models/scaled")[1]["model_version_status"]
        return any(s["version"] == "2" and s["state"] == "END" for s in status)

    until(failed)
    status, health, _ = server.get("/healthz")
    assert status == 200 and health["status"] == "degraded"
    assert health["degraded"]["scaled"]["wanted_version"] == 2
    assert health["degraded"]["scaled"]["serving_version"] == 1
    assert server.get("/healthz?strict=1")[0] == 503
    assert server.post("/v1/models/scaled:predict", {"instances": [[1, 1, 1]]})[2][
        "X-Model-Version"] == "1"
    # The rest of the copy arrives: the failed version is retried and takes over.
    shutil.copytree(os.path.join(source, "variables"), target / "variables")
    until(lambda: server.post("/v1/models/scaled:predict", {"instances": [[1, 1, 1]]})[1]
          == {"predictions": [[5.0, 5.0, 5.0]]})
    status, health, _ = server.get("/healthz")
    assert status == 200 and health["status"] == "ok"


def test_a_version_replaced_under_its_number_is_loaded_again(server, base, tmp_path):
    until(lambda: server.post("/v1/models/scaled/versions/2:predict",
                              {"instances": [[1, 1, 1]]})[0] == 200)
    replacement = scaled(str(tmp_path / "k7"), 7)
    trash = base.parent / "old-2"
    os.rename(base / "2", trash)
    shutil.copytree(replacement, base / "2")
    until(lambda: server.post("/v1/models/scaled/versions/2:predict",
                              {"instances": [[1, 1, 1]]})[1] == {"predictions": [[9.0] * 3]})


def test_the_log_has_one_line_per_client_abort_and_no_traceback(server):
    log = server.stop()
    assert log.count("closed the connection before its body was received") == 3
    assert "Traceback" not in log


def test_sigterm_answers_every_request_already_received_and_exits_0(base):
    running = Server("--model_name", "scaled", "--model_base_path", str(base),
                     "--max-batch-size", "0", "--grace-seconds", "120", "--threads", "1")
    rows = np.random.default_rng(1).random((20000, 3)).round(3)
    body = json.dumps({"instances": rows.tolist()}).encode()
    # The newest version (TF Serving's default policy): whichever the earlier tests left.
    request = (f"POST /v1/models/scaled:predict HTTP/1.1\r\nHost: x\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
               ).encode() + body
    sockets = [_connect(running) for _ in range(16)]
    for sock in sockets:
        sock.sendall(request)
    running.process.send_signal(signal.SIGTERM)
    statuses = []
    for sock in sockets:
        with sock.makefile("rb") as answer:
            line = answer.readline()
            statuses.append(int(line.split()[1]) if line else None)
        sock.close()
    assert statuses == [200] * 16
    assert running.process.wait(timeout=120) == 0
    assert "stopped" in running.stop()
    with pytest.raises(OSError):
        _connect(running)   # no longer accepting
