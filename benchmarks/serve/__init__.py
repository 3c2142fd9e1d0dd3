"""Benchmarks of using a trained run: the Python API warm call, the prediction server."""
