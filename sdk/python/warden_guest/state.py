"""The small key/value store scoped to this plugin (the `state` import), so `resume` can
pick up what an earlier task left: bytes, or JSON values."""

from __future__ import annotations

import json
from typing import Any, Optional

from . import _wit
from .errors import Internal, call


def _state():
    return _wit.require(_wit.state, "state")


def get(key: str) -> Optional[bytes]:
    value = call(_state().get, key)
    return None if value is None else bytes(value)


def set(key: str, value: bytes) -> None:  # noqa: A001 - the WIT name
    call(_state().set, key, value)


def delete(key: str) -> None:
    call(_state().delete, key)


def get_json(key: str) -> Any:
    """The JSON value under `key`, `None` when there is none; a stored value that is not
    JSON is an `internal` error naming the key (the plugin wrote it)."""
    raw = get(key)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError as e:
        raise Internal(f"state `{key}` is not JSON: {e}") from None


def set_json(key: str, value: Any) -> None:
    try:
        raw = json.dumps(value).encode()
    except (TypeError, ValueError) as e:
        raise Internal(f"serialising state `{key}`: {e}") from None
    set(key, raw)
