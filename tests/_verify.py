"""Tests run ``attnlab verify``'s own parity checks (one definition of each) and hold them to
the tolerance its registry states."""

from __future__ import annotations

from attnlab.verify.check import Measure
from attnlab.verify.registry import CHECKS


def assert_verified(m: Measure, component: str) -> None:
    """The cases measured in ``m`` pass the tolerance of verify's row ``component``."""
    tolerance = next(c.tolerance for c in CHECKS if c.component == component)
    assert not m.failures, m.failures
    assert m.cases > 0, "no case ran"
    assert m.error <= tolerance, f"{component}: max |error| {m.error:.3g} > {tolerance:.0e}"
