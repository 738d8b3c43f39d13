"""Benchmark suite of Queuety for Django (run it with ``benchmarks/run``; see README.md)."""
