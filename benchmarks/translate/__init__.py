"""Translation: training, BLEU comparison, decoding speed."""
