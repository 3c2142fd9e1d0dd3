"""The training engine: optimizer step time, peak memory per task."""
