"""Hot reload under load: 64 clients for 20 s while `current` is promoted twice, rolled back
once, and then moved to a damaged version. Zero errors; every answer from a whole version;
versions switch in the order they were made current."""

import os
import threading
import time

import pytest

from tapeworks.deploy import Registry
from tests.serve.saved_models import scaled
from tests.serve.server_process import Server

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
CLIENTS, SECONDS = 64, 20.0


def _follows(seen, order):
    """Whether `seen` (consecutive repeats dropped) walks forward through `order`."""
    position = 0
    for version in seen:
        while position < len(order) and order[position] != version:
            position += 1
        if position == len(order):
            return False
    return True


def test_promotions_and_a_rollback_under_load_lose_no_request(tmp_path):
    registry = Registry(tmp_path / "registry")
    for k in (1, 2, 3, 4):
        registry.publish("scaled", scaled(str(tmp_path / f"k{k}"), k), promote=k == 1)
    server = Server(str(tmp_path / "registry"), "--poll-seconds", "0.2")
    try:
        answers = [[] for _ in range(CLIENTS)]
        stop = threading.Event()

        def client(mine):
            while not stop.is_set():
                status, body, headers = server.post("/v1/models/scaled:predict",
                                                    {"instances": [[1.0, 1.0, 1.0]]})
                value = body["predictions"][0][0] if status == 200 else None
                mine.append((status, headers.get("X-Model-Version"), value))

        threads = [threading.Thread(target=client, args=(answers[i],)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        order = [1]
        started = time.monotonic()
        for at, move in ((4, lambda: registry.promote("scaled", 2)),
                         (8, lambda: registry.promote("scaled", 3)),
                         (12, lambda: registry.rollback("scaled")),
                         (15, "damage")):
            time.sleep(max(0.0, at - (time.monotonic() - started)))
            if move == "damage":
                # Version 4 was published whole; a file of it is damaged afterwards,
                # then it is promoted: it must not load, and 2 keeps serving.
                variables = tmp_path / "registry" / "scaled" / "4" / "variables"
                data = next(p for p in variables.iterdir() if p.name.startswith("variables.data"))
                data.write_bytes(b"\0" * 8)
                registry.promote("scaled", 4)
            else:
                move()
                order.append(registry.current("scaled"))
        time.sleep(max(0.0, SECONDS - (time.monotonic() - started)))
        stop.set()
        for t in threads:
            t.join()
        flat = [a for mine in answers for a in mine]
        assert len(flat) > CLIENTS * 10
        assert [a for a in flat if a[0] != 200] == []
        # Every answer came from a whole version: y = k x + 2 with k its version.
        assert all(value == float(version) + 2.0 for _, version, value in
                   ((s, int(v), val) for s, v, val in flat))
        assert order == [1, 2, 3, 2]
        assert {int(v) for _, v, _ in flat} == {1, 2, 3}
        for mine in answers:
            seen = [int(v) for _, v, _ in mine]
            deduped = [v for i, v in enumerate(seen) if i == 0 or v != seen[i - 1]]
            assert _follows(deduped, order), deduped
        assert int(answers[0][-1][1]) == 2   # the damaged version 4 never took over
        status = server.get("/v1/models/scaled")[1]["model_version_status"]
        states = {s["version"]: (s["state"], s["status"]["error_code"]) for s in status}
        assert states == {"4": ("END", "UNKNOWN"), "2": ("AVAILABLE", "OK")}
        failed = next(s for s in status if s["version"] == "4")["status"]["error_message"]
        assert "no longer matches the content hash" in failed
        health = server.get("/healthz")[1]
        assert health["models"]["scaled"]["default_version"] == 2
        assert "content hash" in health["models"]["scaled"]["failures"]["4"]
    finally:
        log = server.stop()
    assert "version 4 failed to load" in log
    assert os.path.isdir(tmp_path / "registry" / "scaled" / "4")
