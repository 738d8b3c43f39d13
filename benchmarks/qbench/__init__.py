"""Benchmark suite of Queuety for Django (run with ``benchmarks/run``; see benchmarks/README.md)."""
