"""Benchmark scenarios; each module exposes `SCENARIO`."""
