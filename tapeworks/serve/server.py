"""The `tapeworks serve` command: parse flags (tapeworks' and TF Serving's), load, serve.

    tapeworks serve ROOT [--host 127.0.0.1] [--port 8501] [--max-batch-size 32]
                         [--batch-timeout-ms 0] [--max-queue 256] [--poll-seconds 1]
    tapeworks serve --rest_api_port=8501 --model_name=NAME --model_base_path=/models/NAME
    tapeworks serve --rest_api_port=8501 --model_config_file=/models/models.config

TF Serving's command line moves over by changing the program's name. Its
`--port` is the gRPC port: with `--rest_api_port` given, `--port` is read as
that and refused (gRPC is not served). Every model is loaded and warmed
before the port opens, as TF Serving does; then a poller thread re-reads
the plan every `--poll-seconds` (hot reload). SIGTERM drains: requests
already received are answered (within `--grace-seconds`), then the
process exits 0 (`connections.py`).
"""

import argparse
import asyncio
import logging
import sys
import threading

TF_SERVING_FLAGS_IGNORED = ("rest_api_timeout_in_ms", "tensorflow_session_parallelism",
                            "tensorflow_intra_op_parallelism", "tensorflow_inter_op_parallelism")


def _bool(text):
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_arguments(parser):
    parser.add_argument("root", nargs="?", help="a tapeworks registry (or a folder of TF Serving "
                        "model folders) to serve")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=None,
                        help="REST port (default 8501); with --rest_api_port, TF Serving's "
                             "meaning: the gRPC port")
    parser.add_argument("--grpc-port", type=int, default=None,
                        help="also serve TF Serving's gRPC PredictionService and ModelService "
                             "on this port (needs the tensorflow-serving-api package)")
    parser.add_argument("--max-batch-size", type=int, default=32,
                        help="rows per batched call across concurrent requests (0: no batching)")
    parser.add_argument("--batch-timeout-ms", type=float, default=0.0,
                        help="how long a batch waits for more requests (default 0: it takes "
                             "what is waiting and runs; batches form while one runs)")
    parser.add_argument("--max-queue", type=int, default=256,
                        help="requests waiting per signature before answering 503")
    parser.add_argument("--max-body-mb", type=float, default=16.0,
                        help="largest request body (413 above)")
    parser.add_argument("--poll-seconds", type=float, default=1.0,
                        help="how often the registry or config is read again")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads that run models (TensorFlow uses all cores per call)")
    parser.add_argument("--allow-ops", default="",
                        help="comma-separated ops that act on files, processes or the network "
                             "(tapeworks.deploy.graph_ops) to allow in the models' graphs; by "
                             "default a model with any of them is not loaded")
    parser.add_argument("--grace-seconds", type=float, default=10.0,
                        help="on SIGTERM: how long requests already received may take to be "
                             "answered before the server exits (default 10)")
    parser.add_argument("--idle-timeout-seconds", type=float, default=5.0,
                        help="close a connection idle this long (before its first request or "
                             "between requests; default 5)")
    parser.add_argument("--max-header-kb", type=float, default=None,
                        help="largest request line and headers together (431 above; default 64)")
    parser.add_argument("--max-headers", type=int, default=None,
                        help="most header fields in a request (431 above; default 100)")
    parser.add_argument("--header-timeout-seconds", type=float, default=10.0,
                        help="close a connection whose request headers take longer (default 10)")
    parser.add_argument("--body-timeout-seconds", type=float, default=30.0,
                        help="answer 408 when a request body takes longer to arrive (default 30)")
    tf = parser.add_argument_group("TensorFlow Serving's flags")
    tf.add_argument("--rest_api_port", type=int, default=None)
    tf.add_argument("--model_name", default=None)
    tf.add_argument("--model_base_path", default=None)
    tf.add_argument("--model_config_file", default=None)
    tf.add_argument("--enable_batching", type=_bool, nargs="?", const=True, default=None)
    tf.add_argument("--file_system_poll_wait_seconds", type=float, default=None)
    tf.add_argument("--model_config_file_poll_wait_seconds", type=float, default=None)
    tf.add_argument("--rest_api_num_threads", type=int, default=None)
    for flag in TF_SERVING_FLAGS_IGNORED:
        tf.add_argument("--" + flag, default=None, help=argparse.SUPPRESS)


def settings_from(args):
    """(REST port, Source arguments, Settings, poll seconds, gRPC port or None), or SystemExit."""
    from tapeworks.serve.app import Settings

    grpc_port = args.grpc_port
    if args.rest_api_port is not None:
        # TF Serving's flags: --port is its gRPC port.
        port = args.rest_api_port
        if args.port is not None:
            grpc_port = args.port
    else:
        port = 8501 if args.port is None else args.port
    if args.model_name and not args.model_base_path:
        raise SystemExit("tapeworks serve: --model_name needs --model_base_path (the folder "
                         "holding the model's version folders).")
    batch = args.max_batch_size
    if args.enable_batching is False:
        batch = 0
    poll = args.poll_seconds
    for flag in (args.file_system_poll_wait_seconds, args.model_config_file_poll_wait_seconds):
        if flag is not None and flag > 0:
            poll = flag
    threads = args.rest_api_num_threads or args.threads
    settings = Settings(max_batch_size=batch, batch_timeout_ms=args.batch_timeout_ms,
                        max_queue=args.max_queue,
                        max_body_bytes=int(args.max_body_mb * (1 << 20)), threads=threads,
                        body_timeout=args.body_timeout_seconds)
    source = dict(root=args.root, model_config_file=args.model_config_file,
                  model_name=args.model_name, model_base_path=args.model_base_path)
    return port, source, settings, poll, grpc_port


def _freeze_heap():
    """Moves every object alive now out of the garbage collector's reach (`gc.freeze`).

    TensorFlow and the loaded models are millions of long-lived objects; a
    full collection walks all of them, which under load stalled requests for
    a quarter of a second (a one-off run: p99 252 ms against p50 16 ms with
    64 clients). Frozen, a collection walks only what requests allocate.
    Called again after each version is loaded.
    """
    import gc

    gc.collect()
    gc.freeze()


def run(args):
    import uvicorn

    from tapeworks.serve import connections
    from tapeworks.serve.app import ServingApp
    from tapeworks.serve.batching import buckets
    from tapeworks.serve.config import ServingConfigError, Source
    from tapeworks.serve.manager import ModelManager

    logging.basicConfig(level=logging.INFO, format="tapeworks serve: %(message)s")
    port, source_args, settings, poll, grpc_port = settings_from(args)
    if grpc_port:
        try:
            import tensorflow_serving.apis.prediction_service_pb2_grpc  # noqa: F401
        except ImportError:
            raise SystemExit("tapeworks serve: gRPC (--grpc-port, or --port with "
                             "--rest_api_port) needs TF Serving's messages. Fix: pip install "
                             "'tapeworks[grpc]' (tensorflow-serving-api).") from None
    try:
        source = Source(**source_args)
    except ServingConfigError as error:
        raise SystemExit(f"tapeworks serve: {error}") from None
    warm = buckets(settings.max_batch_size) if settings.max_batch_size > 1 else [1]
    allow_ops = [op.strip() for op in args.allow_ops.split(",") if op.strip()]
    manager = ModelManager(source, warm_batch_sizes=warm, allow_ops=allow_ops)
    manager.sync()
    if manager.plan_error:
        raise SystemExit(f"tapeworks serve: {manager.plan_error}")
    for name, state in sorted(manager.states.items()):
        print(f"tapeworks serve: {name}: versions {sorted(state.versions) or 'none'} loaded"
              + (f", default {state.default}" if state.default is not None else "")
              + (f"; failed: {state.failures}" if state.failures else ""), flush=True)
    serving = ServingApp(manager, settings)
    _freeze_heap()
    manager.after_load = _freeze_heap
    stop = threading.Event()
    poller = threading.Thread(target=manager.poll_forever, args=(poll, stop), daemon=True,
                              name="tapeworks-serve-poller")
    poller.start()
    print(f"tapeworks serve: {source.describe()} on http://{args.host}:{port}"
          + (f" and gRPC {args.host}:{grpc_port}" if grpc_port else "")
          + f" (batching: {settings.max_batch_size or 'off'})", flush=True)
    protocol = type("HttpProtocol", (connections.TimedHttpProtocol,),
                    {"header_timeout": args.header_timeout_seconds,
                     "max_header_bytes": connections.MAX_HEADER_BYTES
                     if args.max_header_kb is None else int(args.max_header_kb * 1024),
                     "max_header_fields": connections.MAX_HEADER_FIELDS
                     if args.max_headers is None else args.max_headers})
    config = uvicorn.Config(serving.app, host=args.host, port=port, log_level="warning",
                            access_log=False, http=protocol,
                            timeout_keep_alive=args.idle_timeout_seconds,
                            timeout_graceful_shutdown=args.grace_seconds)
    http = connections.DrainingServer(config)

    async def serve():
        # One event loop for both protocols: gRPC and REST requests share the
        # batchers, which belong to the loop that created them.
        grpc_server = None
        if grpc_port:
            from tapeworks.serve import grpc_service

            try:
                grpc_server = await grpc_service.start(serving, args.host, grpc_port)
            except OSError as error:
                raise SystemExit(f"tapeworks serve: {error} (is the port taken?)") from None
        try:
            await http.serve()
        finally:
            if grpc_server is not None:
                await grpc_server.stop(grace=2)

    try:
        # uvicorn's own choice of loop (uvloop when installed), as uvicorn.run makes it.
        with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
            runner.run(serve())
    finally:
        stop.set()
        serving.executor.shutdown(wait=False, cancel_futures=True)
    print("tapeworks serve: stopped", flush=True)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tapeworks serve")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
