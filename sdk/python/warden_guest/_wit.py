"""The componentize-py bindings of the `plugin` world (`wit_world`), imported once here.

They exist while componentize-py builds (and so inside the component); in plain CPython
they are absent and every name here is `None`, so the pure parts of this package (errors,
metadata) still import and can be unit-tested. Importing them at module load matters: the
component is a snapshot taken after the app was imported, and a WASI-less plugin cannot
import modules later.
"""

try:
    from componentize_py_types import Err
    from wit_world import exports
    from wit_world.imports import cancel, clock, events, http, log, state, types
except ImportError:  # plain CPython: no bindings
    Err = exports = cancel = clock = events = http = log = state = types = None


def require(module, what: str):
    """`module` if the bindings are there, else an `unavailable` error naming `what`."""
    if module is None:
        from .errors import Unavailable

        raise Unavailable(f"{what}: the warden bindings (wit_world) exist only inside a componentize-py build")
    return module
