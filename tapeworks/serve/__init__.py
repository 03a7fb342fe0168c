"""`tapeworks serve`: TensorFlow Serving's REST API, from a registry or TF Serving's own flags.

`config.py` (what to serve: TF Serving's model config, base paths, a
registry), `servable.py` (one loaded SavedModel version), `manager.py` (the
loaded versions and the hot-reload switch), `rest.py` (TF Serving's JSON
bodies), `batching.py` (dynamic batching), `app.py` (the ASGI application),
`server.py` (the command line: uvicorn, the poller).
"""
