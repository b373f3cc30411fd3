"""A reference's `metadata` (the operator's key/value strings) with typed getters whose
errors name the key. A blank value counts as absent; the first pair with a key wins."""

from __future__ import annotations

from typing import Iterable, Optional, Tuple

from .errors import InvalidInput

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_UNITS_MS = {"ms": 1, "": 1000, "s": 1000, "sec": 1000, "secs": 1000, "m": 60_000, "min": 60_000, "mins": 60_000, "h": 3_600_000}
#: Largest duration `duration_ms` accepts: the WIT `timeout-ms` is a u32.
MAX_DURATION_MS = 2**32 - 1


class Metadata:
    """`Metadata(reference.metadata)`, or `Metadata.of(reference)`."""

    def __init__(self, pairs: Iterable[Tuple[str, str]]):
        self._pairs = list(pairs)

    @classmethod
    def of(cls, reference) -> "Metadata":
        return cls(reference.metadata)

    def raw(self, key: str) -> Optional[str]:
        """The value as written, `None` when absent or blank."""
        for k, v in self._pairs:
            if k == key:
                return v if v.strip() else None
        return None

    def get(self, key: str, default: Optional[str] = None) -> Optional[str]:
        """The value, trimmed; `default` when absent or blank."""
        v = self.raw(key)
        return v.strip() if v is not None else default

    def require(self, key: str) -> str:
        v = self.get(key)
        if v is None:
            raise InvalidInput(f"metadata `{key}` is required")
        return v

    def int(self, key: str, default: Optional[int] = None) -> Optional[int]:
        v = self.get(key)
        if v is None:
            return default
        try:
            return int(v)
        except ValueError:
            raise _invalid(key, v, "expected an integer") from None

    def flag(self, key: str, default: Optional[bool] = None) -> Optional[bool]:
        """`true`/`false`, `yes`/`no`, `on`/`off`, `1`/`0` (any case)."""
        v = self.get(key)
        if v is None:
            return default
        if v.lower() in _TRUE:
            return True
        if v.lower() in _FALSE:
            return False
        raise _invalid(key, v, "expected true or false")

    def duration_ms(self, key: str, default: Optional[int] = None) -> Optional[int]:
        """`250ms`, `30s`, `2m`, `1h` or a bare number of seconds, in milliseconds."""
        v = self.get(key)
        return default if v is None else parse_duration_ms(key, v)


def _invalid(key: str, value: str, why: str) -> InvalidInput:
    return InvalidInput(f'metadata `{key}` "{value}": {why}')


def parse_duration_ms(key: str, text: str) -> int:
    t = text.strip()
    split = next((i for i, c in enumerate(t) if not (c.isdigit() or c == ".")), len(t))
    number, unit = t[:split], t[split:].strip()
    try:
        n = float(number)
    except ValueError:
        raise _invalid(key, t, "expected e.g. 30s, 1500ms, 2m") from None
    if unit not in _UNITS_MS:
        raise _invalid(key, t, f'unknown unit "{unit}"')
    ms = n * _UNITS_MS[unit]
    if not 1 <= ms <= MAX_DURATION_MS:
        raise _invalid(key, t, "out of range")
    return int(ms)
