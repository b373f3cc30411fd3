"""The one error type of a plugin: `Error` and one subclass per case of the WIT `error`
variant (`NotFound`, `InvalidInput`, ...). Raise them from `resolve`/`execute`; the export
glue (`warden_guest.export`) turns them into the WIT error, and errors from host imports
come back as these classes (`call`).
"""

from __future__ import annotations

import json

from . import _wit


class Error(Exception):
    """Why a call failed. `kind` is the WIT case name, `message` the text."""

    kind = "internal"
    _case = "Internal"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = str(message)

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.message == other.message

    def __hash__(self) -> int:
        return hash((type(self), self.message))

    def context(self, context: str) -> "Error":
        """The same case with `context: ` before the message (unless already mentioned)."""
        if context in self.message:
            return self
        return type(self)(f"{context}: {self.message}")

    def to_wit(self):
        """The WIT `error` value (`types.Error_<Case>`); needs the bindings."""
        types = _wit.require(_wit.types, "converting an error")
        return getattr(types, f"Error_{self._case}")(self.message)

    @staticmethod
    def from_wit(value) -> "Error":
        """The class for a WIT `error` value (`types.Error_NotFound(...)` → `NotFound`)."""
        case = type(value).__name__.removeprefix("Error_")
        return CASES.get(case, Internal)(getattr(value, "value", str(value)))


class NotFound(Error):
    """The thing asked for does not exist (agent, file, task, key)."""

    kind, _case = "not-found", "NotFound"


class InvalidInput(Error):
    """The input is malformed or missing a field; the text names it."""

    kind, _case = "invalid-input", "InvalidInput"


class Denied(Error):
    """A capability or policy refused the call; the text names the capability."""

    kind, _case = "denied", "Denied"


class Timeout(Error):
    """The deadline passed."""

    kind, _case = "timeout", "Timeout"


class Remote(Error):
    """A remote peer (model provider, A2A/MCP server, HTTP endpoint) failed."""

    kind, _case = "remote", "Remote"


class Unavailable(Error):
    """The capability exists but is not available in this host build or config."""

    kind, _case = "unavailable", "Unavailable"


class InputRequired(Error):
    """The remote agent needs more input; the text is its question."""

    kind, _case = "input-required", "InputRequired"


class Internal(Error):
    """Anything else."""

    kind, _case = "internal", "Internal"


class Canceled(Error):
    """The task was canceled while the plugin waited on the host; a short grace period
    (`clock.remaining_ms()`) is left to clean up and return (WIT 0.2.0)."""

    kind, _case = "canceled", "Canceled"


CASES = {
    cls._case: cls
    for cls in (NotFound, InvalidInput, Denied, Timeout, Remote, Unavailable, InputRequired, Internal, Canceled)
}


def from_exception(e: BaseException) -> Error:
    """Any exception as an `Error`: a WIT error (`Err`) keeps its case, JSON and UTF-8
    decoding failures are `invalid-input`, anything else `internal` naming its type."""
    if isinstance(e, Error):
        return e
    if _wit.Err is not None and isinstance(e, _wit.Err):
        return Error.from_wit(e.value)
    if isinstance(e, json.JSONDecodeError):
        return InvalidInput(f"invalid JSON: {e}")
    if isinstance(e, UnicodeDecodeError):
        return InvalidInput(f"not UTF-8 text: {e}")
    return Internal(f"{type(e).__name__}: {e}")


def call(function, *args):
    """Calls a host import; a WIT error it raises comes back as this module's `Error`."""
    try:
        return function(*args)
    except Exception as e:
        if _wit.Err is not None and isinstance(e, _wit.Err):
            raise Error.from_wit(e.value) from None
        raise
