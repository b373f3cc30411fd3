"""Time as the call sees it (the `clock` import, WIT 0.2.0): a monotonic clock to pace
polling, the call's remaining deadline, and a sleep the host bounds by that deadline and
ends early (`Canceled`) when the task is canceled. Needs no capability grant."""

from __future__ import annotations

from . import _wit
from .errors import call


def _clock():
    return _wit.require(_wit.clock, "clock")


def now_ms() -> int:
    """Monotonic milliseconds (arbitrary origin, never backwards)."""
    return _clock().now_ms()


def remaining_ms() -> int:
    """Milliseconds left before the host interrupts this call."""
    return _clock().remaining_ms()


def sleep(ms: int) -> None:
    """Sleeps `ms` milliseconds; `Timeout` at once when it would not end before the
    deadline, `Canceled` when the task is canceled meanwhile."""
    call(_clock().sleep, ms)
