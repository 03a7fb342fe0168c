"""`tapeworks bench serve` in quick mode: both servers, every row, and issue 36's two measures
(many clients; /healthz during one big request) present and sane. No timing is asserted."""

import pytest

from tapeworks.bench.scenarios import serve

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def test_quick_serve_bench_has_every_row_and_the_issue_36_measures():
    result = serve.run(quick=True, repeats=1)
    batching = {row["batching"] for row in result["rows"]}
    assert batching == {"off", "on (max 32)", "ceiling: status GET, no model"}
    assert all(row["errors"] == 0 and row["requests_per_s"] > 0 for row in result["rows"])
    many = result["many_clients"]
    assert many["clients"] == serve.QUICK_MANY_CLIENTS and many["errors"] == 0
    assert many["p50_ms"] <= many["p99_ms"]
    big = result["health_during_big_request"]
    assert big["status"] == 200 and big["values"] == serve.QUICK_BIG_VALUES
    assert any(key.startswith("MLP, 32 clients") for key in result["facts"])
    assert "/healthz during one big request" in result["facts"]
