"""``python -m attnlab`` (and ``torchrun -m attnlab``) run the command line."""

import sys

from attnlab.cli import main

sys.exit(main())
