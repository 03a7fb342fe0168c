"""The batcher in-process (asyncio, a blocking model), and a full queue over real HTTP."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf

from tapeworks.serve.batching import Batcher, QueueFull, buckets
from tests.serve.server_process import Server


def test_buckets_are_powers_of_two_up_to_the_maximum():
    assert buckets(32) == [1, 2, 4, 8, 16, 32] and buckets(12) == [1, 2, 4, 8, 12]
    assert buckets(1) == [1]


def test_requests_are_batched_padded_to_a_bucket_and_get_their_own_rows():
    calls, gate = [], threading.Event()

    def model(inputs):
        gate.wait(5)
        calls.append(len(inputs["x"]))
        return {"y": inputs["x"] * 10}

    async def scenario():
        batcher = Batcher(model, max_batch_size=8, timeout=0.05, max_queue=16,
                          executor=ThreadPoolExecutor(1))
        gate.set()
        first = await batcher.submit({"x": np.array([[1.0]])}, 1)   # alone: bucket 1
        gate.clear()
        # The next three arrive together (5 rows: padded to the bucket of 8).
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, gate.set)
        results = await asyncio.gather(
            batcher.submit({"x": np.array([[2.0], [3.0]])}, 2),
            batcher.submit({"x": np.array([[4.0]])}, 1),
            batcher.submit({"x": np.array([[5.0], [6.0]])}, 2))
        return first, results

    first, results = asyncio.run(scenario())
    assert calls == [1, 8]
    np.testing.assert_array_equal(first["y"], [[10.0]])
    assert [r["y"][:, 0].tolist() for r in results] == [[20.0, 30.0], [40.0], [50.0, 60.0]]


def test_a_full_queue_refuses_at_once_and_errors_reach_every_request():
    gate = threading.Event()

    def model(inputs):
        gate.wait(5)
        if np.any(inputs["x"] < 0):
            raise ValueError("negative input")
        return {"y": inputs["x"]}

    async def scenario():
        batcher = Batcher(model, max_batch_size=2, timeout=0.0, max_queue=2,
                          executor=ThreadPoolExecutor(1))
        running = asyncio.ensure_future(batcher.submit({"x": np.ones((2, 1))}, 2))
        await asyncio.sleep(0.05)   # the first batch is in the model, blocked
        waiting = asyncio.ensure_future(batcher.submit({"x": -np.ones((1, 1))}, 1))
        also = asyncio.ensure_future(batcher.submit({"x": np.ones((1, 1))}, 1))
        await asyncio.sleep(0.05)
        assert batcher.depth == 2
        with pytest.raises(QueueFull):   # two waiting already: max_queue=2
            await batcher.submit({"x": np.ones((1, 1))}, 1)
        gate.set()
        await running
        outcomes = await asyncio.gather(waiting, also, return_exceptions=True)
        return outcomes

    outcomes = asyncio.run(scenario())
    # Both were in one batch with the negative row: the model's error reaches both.
    assert [type(o).__name__ for o in outcomes] == ["ValueError", "ValueError"]


class Slow(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
    def serve(self, x):
        start = tf.timestamp()
        tf.while_loop(lambda t: tf.timestamp() - start < 0.6, lambda t: [t + 1.0], [0.0])
        return {"y": x + 1.0}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_full_queue_answers_503_with_retry_after_over_http(tmp_path):
    module = Slow()
    tf.saved_model.save(module, str(tmp_path / "slow" / "1"),
                        signatures={"serving_default": module.serve})
    server = Server(f"--model_base_path={tmp_path / 'slow'}", "--model_name=slow",
                    "--max-batch-size", "2", "--batch-timeout-ms", "0", "--max-queue", "1")
    try:
        answers = []

        def call():
            answers.append(server.post("/v1/models/slow:predict", {"instances": [[1.0], [2.0]]}))

        first = threading.Thread(target=call)
        first.start()
        time.sleep(0.2)                 # the first request is in the model (0.6 s)
        second = threading.Thread(target=call)
        second.start()
        time.sleep(0.2)                 # the second waits: the queue (of 1) is full
        status, body, headers = server.post("/v1/models/slow:predict",
                                            {"instances": [[1.0], [2.0]]})
        assert status == 503 and headers["Retry-After"] == "1"
        assert "queue of model 'slow' is full" in body["error"]
        first.join()
        second.join()
        assert [a[:2] for a in answers] == [(200, {"predictions": [[2.0], [3.0]]})] * 2
        metrics = server.text("/metrics")
        assert 'tapeworks_requests_total{code="503",method="predict",model="slow"} 1.0' in metrics
    finally:
        server.stop()
