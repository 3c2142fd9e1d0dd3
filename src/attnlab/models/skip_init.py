"""Building a model whose every weight is about to be read from a file, without drawing the
random initial values first.

``nn.Linear`` and ``nn.Embedding`` draw their weights in their constructors and the models
here draw again in their own initialisers (BERT's N(0, 0.02), the Q4 word table's nibbles):
for the e5 classifier that is 0.4 s of a 3-second ``predict``, and every value is overwritten
by the strict load that follows. Inside :func:`skipping_init` the ``torch.nn.init``
functions leave their tensor as it is and :func:`init_skipped` tells the models' own
initialisers to return at once, on this thread only (a server thread building a model for
training meanwhile still draws). The tensors then hold whatever their allocation held: use
it only where a strict load (every parameter and persistent buffer from the file) follows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

# the initialisers torch's own modules call in their reset_parameters
_NAMES = (
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
    "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "orthogonal_",
)  # fmt: skip

_local = threading.local()
_lock = threading.Lock()
_users = 0
_originals: dict[str, Callable[..., Any]] = {}


def init_skipped() -> bool:
    """True inside :func:`skipping_init` on this thread."""
    return getattr(_local, "depth", 0) > 0


def _guarded(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def init(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return tensor if init_skipped() else original(tensor, *args, **kwargs)

    init.__name__ = name
    init.__doc__ = original.__doc__
    return init


@contextmanager
def skipping_init() -> Iterator[None]:
    """Models built inside skip their random initialisation (see the module's note)."""
    global _users
    with _lock:
        if _users == 0:
            for name in _NAMES:
                _originals[name] = getattr(torch.nn.init, name)
                setattr(torch.nn.init, name, _guarded(name, _originals[name]))
        _users += 1
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1
        with _lock:
            _users -= 1
            if _users == 0:
                for name, original in _originals.items():
                    setattr(torch.nn.init, name, original)
                _originals.clear()
