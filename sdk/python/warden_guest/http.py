"""Outbound HTTP through the host's `http` import, with JSON bodies both ways and status
checks whose errors quote a bounded excerpt of the body. The host enforces the operator's
allow-list, the response size limit and the call's deadline."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

from . import _wit
from .errors import Internal, Remote, call

#: Longest excerpt of a body quoted in an error message, in bytes: the gist of an error
#: page, short enough for a log line.
EXCERPT_BYTES = 300
#: Most of a call's remaining time kept back from a request's timeout by `timeout_within`,
#: so a slow peer ends the request with an error value before the host interrupts the call.
DEADLINE_MARGIN_MAX_MS = 500

_NO_BODY = object()


@dataclass
class Response:
    status: int
    headers: List[Tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> Optional[str]:
        """The first header called `name` (any case)."""
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def raise_for_status(self, what: str) -> "Response":
        """Itself if 2xx, else `Remote("{what} returned HTTP {status}: {excerpt}")`."""
        if self.ok:
            return self
        ex = excerpt(self.body)
        raise Remote(f"{what} returned HTTP {self.status}" + (f": {ex}" if ex else ""))

    def json(self) -> Any:
        """The body as JSON; anything else is a `Remote` error quoting an excerpt."""
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise Remote(f"the response is not the expected JSON ({e}); body: {excerpt(self.body)}") from None

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def excerpt(body: bytes) -> str:
    """The body as trimmed text, at most `EXCERPT_BYTES` (then ending with `…`)."""
    text = body.decode("utf-8", errors="replace").strip()
    raw = text.encode("utf-8")
    if len(raw) <= EXCERPT_BYTES:
        return text
    return raw[:EXCERPT_BYTES].decode("utf-8", errors="ignore") + "…"


def timeout_within(deadline_ms: int) -> int:
    """A request timeout inside a call with `deadline_ms` left: a tenth of it (at most
    `DEADLINE_MARGIN_MAX_MS`) is kept back so a timeout is an error value."""
    margin = min(deadline_ms // 10, DEADLINE_MARGIN_MAX_MS)
    return min(max(deadline_ms - margin, 0), 2**32 - 1)


def request(
    method: str,
    url: str,
    *,
    headers: Sequence[Tuple[str, str]] = (),
    body: Optional[bytes] = None,
    json_body: Any = _NO_BODY,
    timeout_ms: Optional[int] = None,
    auth_secret: Optional[str] = None,
) -> Response:
    """Sends one request and reads the whole response. `json_body` is serialised with
    `content-type`/`accept: application/json` (unless set); `auth_secret` names an
    operator secret the host sends as `Authorization: Bearer …`."""
    headers = list(headers)
    if json_body is not _NO_BODY:
        try:
            body = json.dumps(json_body).encode()
        except (TypeError, ValueError) as e:
            raise Internal(f"serialising the request body: {e}") from None
        for name in ("content-type", "accept"):
            if not any(k.lower() == name for k, _ in headers):
                headers.append((name, "application/json"))
    wit_http = _wit.require(_wit.http, "http")
    req = wit_http.Request(
        method=method, url=url, headers=headers, body=body, timeout_ms=timeout_ms, auth_secret=auth_secret
    )
    r = call(wit_http.send, req)
    return Response(status=r.status, headers=list(r.headers), body=bytes(r.body))


def request_json(method: str, url: str, json_body: Any = _NO_BODY, **kwargs) -> Any:
    """`request`, then a 2xx check and the body as JSON (errors name the URL)."""
    return request(method, url, json_body=json_body, **kwargs).raise_for_status(url).json()


def get_json(url: str, **kwargs) -> Any:
    """`GET url` asking for JSON; the body as JSON."""
    headers = [("accept", "application/json"), *kwargs.pop("headers", ())]
    return request_json("GET", url, headers=headers, **kwargs)


def post_json(url: str, body: Any, **kwargs) -> Any:
    """`POST url` with `body` as JSON; the response body as JSON."""
    return request_json("POST", url, body, **kwargs)
