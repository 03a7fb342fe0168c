"""The ASGI application: TensorFlow Serving's REST API over a `ModelManager`, with batching.

Routes are TF Serving's own (its `http_rest_api_util.cc` regular
expressions, case-insensitive):

    GET  /v1/models/NAME[/versions/N | /labels/L]            version status
    GET  /v1/models/NAME[/versions/N | /labels/L]/metadata   signatures
    POST /v1/models/NAME[/versions/N | /labels/L]:(predict|classify|regress)

plus `GET /healthz` (see `ServingApp.health`) and
Prometheus metrics at `/metrics` and TF Serving's `/monitoring/prometheus/
metrics`. Errors are `{"error": "..."}` with TF Serving's status codes
(400 bad request, 404 unknown model or version, 408 body not received in
time, 413 body too large, 503 queue full, with Retry-After). Every answer
from a model carries `X-Model-Version`: the version that computed it. A
client that hangs up before its body arrived is counted as `code="499"`
(as nginx and Envoy count a client abort) and logged in one line.

A large body's JSON parsing and conversion to arrays, and a large
response's encoding, run in worker threads (starlette's thread pool), in
pieces short enough that the event loop gets the GIL back between them, so
`/healthz` and small requests are answered while a large request is being
read or written. Small ones (INLINE_BODY_BYTES, INLINE_OUTPUT_VALUES) are
done on the event loop, where they cost less than the trip to a thread.
"""

import asyncio
import json
import logging
import re
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from tapeworks.serve import rest
from tapeworks.serve.batching import Batcher, QueueFull
from tapeworks.serve.servable import CLASSIFY, REGRESS, RequestError

logger = logging.getLogger("tapeworks.serve")
PREDICTION = re.compile(
    r"(?i)/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:"
    r"(classify|regress|predict)")
STATUS = re.compile(
    r"(?i)/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?")


CLIENT_CLOSED = 499   # nginx's code for a client that closed the connection first
# Bodies and outputs up to these sizes are read and written on the event loop:
# well under a millisecond of work, less than the trip to a worker thread and
# back (three trips per request cost the batched MLP a third of its throughput).
INLINE_BODY_BYTES = 64 << 10
INLINE_OUTPUT_VALUES = 16 << 10


class Settings:
    def __init__(self, max_batch_size=32, batch_timeout_ms=0.0, max_queue=256,
                 max_body_bytes=16 << 20, threads=2, body_timeout=30.0):
        self.max_batch_size = max_batch_size      # 0: no batching
        self.batch_timeout = batch_timeout_ms / 1000
        self.max_queue = max_queue
        self.max_body_bytes = max_body_bytes
        self.threads = threads
        self.body_timeout = body_timeout          # seconds to receive a whole body


class Metrics:
    """Prometheus metrics in a registry of this app's own (prometheus_client)."""

    def __init__(self):
        import prometheus_client as prom

        self.registry = prom.CollectorRegistry()
        self.requests = prom.Counter("tapeworks_requests", "Requests answered",
                                     ["model", "method", "code"], registry=self.registry)
        self.latency = prom.Histogram(
            "tapeworks_request_latency_seconds", "Request latency, body read to answer",
            ["model", "method"], registry=self.registry,
            buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.batch_size = prom.Histogram(
            "tapeworks_batch_size", "Rows per batched call (before padding)", ["model"],
            registry=self.registry, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        self.queue_depth = prom.Gauge("tapeworks_queue_depth", "Requests waiting for a batch",
                                      ["model"], registry=self.registry)
        self.version = prom.Gauge("tapeworks_model_version", "The version requests get by "
                                  "default", ["model"], registry=self.registry)
        self.load_failures = prom.Gauge("tapeworks_model_load_failures",
                                        "Versions that failed to load", ["model"],
                                        registry=self.registry)

    def render(self):
        import prometheus_client as prom

        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST


def json_response(content, status=200, headers=None):
    """A JSON answer; `content` is text already encoded as JSON, or a value to encode.

    NaN and +-Infinity are written as TF Serving writes them (`NaN`,
    `Infinity`, `-Infinity`), never refused; text that is not valid Unicode
    is replaced, never an error.
    """
    if not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False, allow_nan=True)
    return Response(content.encode("utf-8", errors="replace"), status_code=status,
                    headers=headers, media_type="application/json")


def _error(message, status, headers=None):
    return json_response({"error": message}, status, headers)


class ServingApp:
    def __init__(self, manager, settings=None):
        self.manager = manager
        self.settings = settings or Settings()
        self.metrics = Metrics()
        self.executor = ThreadPoolExecutor(max_workers=self.settings.threads,
                                           thread_name_prefix="tapeworks-serve")
        self._batchers = {}   # (id(servable), signature, None, model name) -> Batcher
        manager.on_switch = self._switched
        for name, state in list(manager.states.items()):
            self._switched(name, state)
        self.app = Starlette(routes=[
            Route("/healthz", self.health, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
            Route("/monitoring/prometheus/metrics", self.prometheus, methods=["GET"]),
            Route("/v1/{rest:path}", self.tf_serving, methods=["GET", "POST"]),
        ])

    def _switched(self, name, state):
        self.metrics.version.labels(name).set(state.default if state.default is not None else -1)
        self.metrics.load_failures.labels(name).set(len(state.failures))
        live = {id(s) for st in self.manager.states.values() for s in st.versions.values()}
        live.update(id(s) for s in state.versions.values())
        for key in [k for k in list(self._batchers) if k[0] not in live]:
            # An unloaded version's batchers go with it (called from the poller's
            # thread: a snapshot of the keys, single-key deletes).
            self._batchers.pop(key, None)

    # Endpoints ---------------------------------------------------------------

    async def health(self, request):
        """200 when every model serves its wanted version; 503 when one serves none.

        Degraded (a wanted version failed to load while an older one still
        serves: the registry's promoted version, or the newest under a base
        path) answers 200 with `"status": "degraded"` and the failing
        versions under `degraded`: the server still answers every request,
        so a load balancer keeps it; `/healthz?strict=1` answers 503 instead,
        for a check that must alert on it.
        """
        states = self.manager.states
        waiting = sorted(n for n, s in states.items() if not s.versions)
        body = {"status": "ok",
                "models": {n: {"default_version": s.default,
                               "versions": sorted(s.versions),
                               "failures": {str(v): m for v, m in s.failures.items()}}
                           for n, s in sorted(states.items())}}
        degraded = {n: {"wanted_version": s.wanted, "serving_version": s.default,
                        "error": s.failures[s.wanted]}
                    for n, s in sorted(states.items()) if s.degraded}
        if self.manager.plan_error:
            body["plan_error"] = self.manager.plan_error
        if waiting or not states:
            body["status"] = "unavailable"
            body["error"] = ("no model has a version available yet" if not states else
                             f"no version available for: {', '.join(waiting)}")
            return json_response(body, 503)
        if degraded:
            body["status"] = "degraded"
            body["degraded"] = degraded
            strict = request.query_params.get("strict", "").lower() in ("1", "true", "yes")
            return json_response(body, 503 if strict else 200)
        return json_response(body)

    async def prometheus(self, request):
        for key, batcher in list(self._batchers.items()):
            self.metrics.queue_depth.labels(key[3]).set(batcher.depth)
        payload, content_type = self.metrics.render()
        return Response(payload, media_type=content_type)

    async def tf_serving(self, request: Request):
        path = request.url.path
        started = time.perf_counter()
        if request.method == "POST":
            match = PREDICTION.fullmatch(path)
        else:
            match = STATUS.fullmatch(path)
        if match is None:
            return _error(f"Malformed request: {request.method} {path}", 400)
        name, version, label, verb = match.groups()
        method = verb.lower() if verb else ("status" if request.method == "GET" else "")
        if request.method == "GET" and verb:
            method = "metadata"
        try:
            # Decoded, then only ever a key of the manager's dict (never a path):
            # an unknown name, encoded or not, is TF Serving's 404.
            name = urllib.parse.unquote(name) if name else name
            label = urllib.parse.unquote(label) if label else label
            if not name:
                raise RequestError("Missing model name in request.")
            version = int(version) if version is not None else None
            if version is not None and version >= 1 << 63:
                raise RequestError(f"Failed to convert version: {version} to numeric.")
            if request.method == "GET":
                if method == "metadata":
                    servable = self.manager.get(name).resolve(version, label)
                    return self._answer(name, method, started,
                                        json_response(servable.metadata()), servable.version)
                return self._answer(name, method, started,
                                    json_response(self.manager.status(name, version, label)))
            body = await self._body(request)
            text, servable = await self._call(name, version, label, method, body)
            return self._answer(name, method, started, json_response(text), servable.version)
        except ClientDisconnect:
            logger.warning("%s %s: the client closed the connection before its body was "
                           "received (counted as %d)", request.method, path, CLIENT_CLOSED)
            return self._answer(name, method, started, Response(status_code=CLIENT_CLOSED))
        except RequestError as error:
            return self._answer(name, method, started, _error(str(error), error.status))
        except QueueFull:
            return self._answer(name, method, started, _error(
                f"The queue of model {name!r} is full ({self.settings.max_queue} requests "
                "waiting). Retry after a moment, or raise --max-queue.", 503,
                {"Retry-After": "1"}))
        except Exception as error:   # noqa: BLE001 - TF Serving's answer: a JSON error, 500
            logger.exception("request %s %s failed", request.method, path)
            return self._answer(name, method, started, _error(
                f"Internal error: {type(error).__name__}: {error}", 500))

    def _answer(self, name, method, started, response, version=None):
        if version is not None:
            response.headers["X-Model-Version"] = str(version)
        # Names nobody serves share one label: a client inventing names must not
        # grow the metrics without bound.
        model = name if name in self.manager.states else "(unknown)"
        self.metrics.requests.labels(model, method, str(response.status_code)).inc()
        self.metrics.latency.labels(model, method).observe(time.perf_counter() - started)
        return response

    async def _body(self, request):
        declared = request.headers.get("content-length")
        limit = self.settings.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RequestError(f"Request body of {int(declared):,} bytes is over the limit of "
                               f"{limit:,} bytes. Fix: send fewer instances per request, or "
                               "raise --max-body-mb.", 413)
        chunks, size = [], 0
        stream = request.stream()
        deadline = asyncio.get_running_loop().time() + self.settings.body_timeout
        while True:
            try:
                # A client that stalls mid-body must not hold a connection forever.
                async with asyncio.timeout_at(deadline):
                    chunk = await anext(stream, None)
            except TimeoutError:
                raise RequestError(f"The request body was not received within "
                                   f"{self.settings.body_timeout:g} s ({size:,} bytes "
                                   "arrived). Fix: send the whole body at once, or raise "
                                   "--body-timeout-seconds.", 408) from None
            if chunk is None:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise RequestError(f"Request body is over the limit of {limit:,} bytes. Fix: "
                                   "send fewer instances per request, or raise --max-body-mb.",
                                   413)
            chunks.append(chunk)

    # Calling a model ----------------------------------------------------------

    async def _call(self, name, version, label, method, body):
        """(response JSON text, the servable that answered), in TF Serving's order of checks.

        The body is parsed before the model is looked up (a malformed body gets
        the body's error, as TF Serving's handler answers); classify and
        regress read their examples before the signature's method is checked.
        """
        large = len(body) > INLINE_BODY_BYTES

        async def reading(function, *args):
            return await run_in_threadpool(function, *args) if large else function(*args)

        async def writing(function, outputs, *args):
            values = sum(getattr(v, "size", 1) for v in outputs.values())
            if values > INLINE_OUTPUT_VALUES:
                return await run_in_threadpool(function, outputs, *args)
            return function(outputs, *args)

        document, signature_name = await reading(rest.parse_body, body)
        if method == "predict":
            servable = self.manager.get(name).resolve(version, label)
            servable.signature(signature_name)
            key = signature_name or "serving_default"
            inputs, format = await reading(rest.predict_inputs, document, servable.specs[key],
                                           servable.checks_shapes)
            outputs = await self.run_model(servable, key, inputs)
            return await writing(rest.predict_response, outputs, format), servable
        wanted = CLASSIFY if method == "classify" else REGRESS
        examples = await reading(rest.examples, document, wanted)
        servable = self.manager.get(name).resolve(version, label)
        key = servable.example_signature(signature_name, wanted)
        outputs = await self.run_model(servable, key, {"inputs": examples})
        encode = rest.classify_response if method == "classify" else rest.regress_response
        return await writing(encode, outputs), servable

    async def run_model(self, servable, key, inputs):
        """Runs signature `key` of `servable` on checked inputs: batched where it can be."""
        loop = asyncio.get_running_loop()
        settings = self.settings

        def run(arrays):
            try:
                return servable.run(key, arrays)
            except Exception as error:   # noqa: BLE001 - TensorFlow's InvalidArgumentError & co.
                raise RequestError(_tensorflow_message(error)) from None

        rows = {len(a) if a.ndim else None for a in inputs.values()}
        specs = servable.specs[key]
        # Batched only where every input's shape past the batch is the
        # signature's own, fully known: requests then always concatenate, and
        # one batcher per signature is enough (a TF1 graph fed other shapes, or
        # a signature with unknown sizes, runs each request as it came).
        fixed = all(specs[k].shape is not None and None not in specs[k].shape[1:]
                    and tuple(specs[k].shape[1:]) == a.shape[1:] for k, a in inputs.items())
        if settings.max_batch_size <= 1 or not servable.batchable(key) or len(rows) != 1 \
                or None in rows or not fixed:
            return await loop.run_in_executor(self.executor, run, inputs)
        batch_key = (id(servable), key, None, servable.name)
        batcher = self._batchers.get(batch_key)
        if batcher is None:
            batcher = self._batchers[batch_key] = Batcher(
                run, max_batch_size=settings.max_batch_size, timeout=settings.batch_timeout,
                max_queue=settings.max_queue, executor=self.executor,
                on_batch=lambda rows, padded, n=servable.name:
                    self.metrics.batch_size.labels(n).observe(rows))
        return await batcher.submit(inputs, rows.pop())


def _tensorflow_message(error):
    text = getattr(error, "message", None) or str(error)
    return text.strip().splitlines()[0][:1000] if text.strip() else type(error).__name__


__all__ = ["ServingApp", "Settings"]
