"""Cancellation of the task a call serves (the `cancel` import, WIT 0.2.0): poll it in
loops or wait on it with a timeout. After a cancellation the call has a short grace
period (`clock.remaining_ms()`) to clean up and return. Needs no capability grant."""

from __future__ import annotations

from . import _wit


def _cancel():
    return _wit.require(_wit.cancel, "cancel")


def is_canceled() -> bool:
    """Whether the task has been canceled (once true, true for the rest of the call)."""
    return bool(_cancel().is_canceled())


def wait(timeout_ms: int) -> bool:
    """Waits up to `timeout_ms` (capped by the time left) for the task to be canceled;
    true when it was."""
    return bool(_cancel().wait(timeout_ms))
