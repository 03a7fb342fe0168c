"""`tapeworks serve`: TF Serving's REST (and gRPC) API, from a registry or TF Serving's flags.

`config.py` (what to serve: TF Serving's model config, base paths, a
registry), `servable.py` (one loaded SavedModel version), `manager.py` (the
loaded versions and the hot-reload switch), `rest.py` (TF Serving's JSON
bodies), `json_body.py` (a body's JSON read without recursion, in pieces),
`json_tensor.py` (JSON values <-> tensors, TF Serving's messages and number
format), `batching.py` (dynamic batching), `app.py` (the ASGI application),
`connections.py` (idle/stalled connection timeouts, the SIGTERM drain),
`warmup.py` (TF Serving's warm-up file), `grpc_service.py` (TF Serving's
gRPC services, optional), `server.py` (the
command line: uvicorn and gRPC on one event loop, the poller).
"""
