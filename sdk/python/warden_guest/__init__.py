"""`warden_guest`: the Python SDK for warden protocol plugins (componentize-py).

On top of componentize-py's generated `wit_world` bindings of the `plugin` world:

- `Error` and one subclass per WIT `error` case (`NotFound`, `InvalidInput`, `Denied`,
  `Timeout`, `Remote`, `Unavailable`, `InputRequired`, `Internal`, `Canceled`);
- `Metadata`: the reference's metadata with typed getters whose errors name the key;
- `http`: requests with JSON bodies, status checks, `get_json`/`post_json`;
- `events.emit`, `state` (bytes or JSON), `log` (best-effort level helpers);
- `clock` (monotonic time, the remaining deadline, a bounded sleep) and `cancel` (the
  task's cancellation, polled or awaited), WIT 0.2.0;
- `Plugin` and `export`: one class for the three exports.

    import warden_guest as wg
    from wit_world.imports import types

    class Echo(wg.Plugin):
        def info(self):
            return types.PluginInfo(name="echo", version="0.1.0", kinds=["ECHO"], capabilities=[])
        def can_resolve(self, reference):
            return reference.kind == "ECHO"
        def resolve(self, reference):
            name = wg.Metadata.of(reference).require("name")
            return wg.definition(name, "Echoes", reference)
        def execute(self, ctx, call, definition):
            return call.prompt

    Meta, Resolver, Executor = wg.export(Echo)
"""

from . import cancel, clock, events, http, log, state
from .errors import (
    Canceled,
    Denied,
    Error,
    InputRequired,
    Internal,
    InvalidInput,
    NotFound,
    Remote,
    Timeout,
    Unavailable,
    call,
    from_exception,
)
from .metadata import Metadata
from .plugin import Plugin, definition, export

__all__ = [
    "Canceled",
    "Denied",
    "Error",
    "InputRequired",
    "Internal",
    "InvalidInput",
    "Metadata",
    "NotFound",
    "Plugin",
    "Remote",
    "Timeout",
    "Unavailable",
    "call",
    "definition",
    "cancel",
    "clock",
    "events",
    "export",
    "from_exception",
    "http",
    "log",
    "state",
]
