"""Benchmarks: named scenarios, an alternating timing harness and a report writer."""
