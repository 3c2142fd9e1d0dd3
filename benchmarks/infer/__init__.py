"""Faster inference: int8, KV cache, speculative decoding."""
