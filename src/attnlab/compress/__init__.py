"""Making a built model smaller: int8 weights, activations and KV cache (``int8``), and
attention-head pruning (``heads``). What a run of ``attnlab quantize`` or ``attnlab prune``
holds is loaded through these by every model that can be compressed."""
