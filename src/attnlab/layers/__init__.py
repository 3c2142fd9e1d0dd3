"""The network pieces every model is built from: attention (and its kernels), positions, blocks,
the sequence mixers (Mamba, RWKV), mixture-of-experts and the CNN's channel attention."""
