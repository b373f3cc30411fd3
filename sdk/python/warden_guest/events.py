"""Progress events into the task's event stream (the `events` import)."""

from __future__ import annotations

import json
from typing import Any

from . import _wit
from .errors import Internal, call


def emit(kind: str, data: Any) -> None:
    """Emits one event (`progress`, `status`, ...) with `data` (a dict) as JSON."""
    try:
        text = json.dumps(data)
    except (TypeError, ValueError) as e:
        raise Internal(f"serialising event data: {e}") from None
    call(_wit.require(_wit.events, "events").emit, kind, text)
