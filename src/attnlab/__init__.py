"""attnlab: Transformers written by hand in PyTorch, each piece proven against a reference."""

__version__ = "0.1.0"
