"""Using trained weights outside training: GPT decoding (``generation``: the context window, the
KV cache, sampling), text generation with a trained language model (``lm``: prompts, stop
strings, ``LMRun``), speculative decoding, beam search for the encoder-decoder, and sentence
embeddings from a BERT checkpoint or run (``embeddings``)."""
