"""``attnlab bench``: speed and memory of attnlab's pieces against PyTorch and Hugging Face.

machine.py   what the numbers were measured on (CPU, threads, matmul peak, precision)
timing.py    interleaved timing rounds; CUDA events on a GPU
memory.py    peak memory of one step, in a fresh process
suites.py    the benchmarks: kernels, MHA, encoder layer, GPT step, generation
scaling.py   one block's time and memory against sequence length, with fitted exponents
report.py    the markdown report; command.py ties them together (`attnlab bench`)
"""

SECTIONS = ("kernels", "mha", "encoder_layer", "gpt_step", "e5_step", "generation", "scaling")
DEFAULT_OUT = "bench-report.md"
