"""``python -m attnlab`` (and ``torchrun -m attnlab``) run the command line."""

from attnlab.cli import console

console()
