"""Benchmark scripts, one package per area; run each as ``python -m benchmarks.AREA.NAME``.

Shared helpers (machine info, writing result pages) live in :mod:`benchmarks.common`.
"""
