"""Attention kernels: MultiHeadAttention, flash, SDPA memory, scaling with T."""
