"""Linear-time mixers (Mamba, RWKV, hybrid) and MoE against the dense LM."""
