"""One class for the three exported interfaces (`meta`, `resolver`, `executor`):
subclass `Plugin`, then `Meta, Resolver, Executor = export(MyPlugin)` in `app.py` —
componentize-py looks for exactly those three names in the app module."""

from __future__ import annotations

from . import _wit
from .errors import from_exception


class Plugin:
    """A protocol plugin. Each call gets a fresh instance (and the host a fresh component
    instance): keep nothing between calls, use `warden_guest.state`."""

    def info(self):
        """`meta.info`: a `types.PluginInfo` (name, version, kinds, capabilities)."""
        raise NotImplementedError

    def can_resolve(self, reference) -> bool:
        """`resolver.can-resolve`: cheap, no I/O expected."""
        raise NotImplementedError

    def resolve(self, reference):
        """`resolver.resolve`: a `types.SubagentDefinition`; raise `InvalidInput` naming
        the field for bad definitions."""
        raise NotImplementedError

    def execute(self, ctx, call, definition) -> str:
        """`executor.execute`: the final text; raise `InputRequired(question)` to pause."""
        raise NotImplementedError


def definition(name: str, description: str, reference, protocol_data: str = "{}", **typed):
    """A `types.SubagentDefinition` of `reference`'s kind. The typed host fields default to
    none set (every tool, the default permission mode, no MCP servers, no egress
    narrowing); pass `tools=[...]`, `permission_mode=types.PermissionMode.PLAN`,
    `mcp_servers=[...]`, `agent_mcp_servers=[types.AgentMcpServer(...)]` (WIT 0.3.0) or
    `egress=[...]` to set them."""
    types = _wit.require(_wit.types, "definition")
    fields = {"tools": None, "permission_mode": None, "mcp_servers": [], "agent_mcp_servers": [], "egress": None}
    unknown = set(typed) - set(fields)
    if unknown:
        raise TypeError(f"unknown definition fields: {', '.join(sorted(unknown))}")
    fields.update(typed)
    return types.SubagentDefinition(
        name=name,
        description=description,
        kind=reference.kind,
        reference=reference,
        protocol_data=protocol_data,
        **fields,
    )


def _guarded(method, *args):
    """Runs an export; any exception leaves as the WIT error (`Error` keeps its case,
    others become `internal` naming their type) instead of trapping the instance."""
    try:
        return method(*args)
    except Exception as e:
        if isinstance(e, _wit.Err):
            raise
        raise _wit.Err(from_exception(e).to_wit()) from None


def export(plugin_class):
    """The `Meta`, `Resolver` and `Executor` classes componentize-py exports, over
    `plugin_class` (a `Plugin` subclass)."""
    exports = _wit.require(_wit.exports, "export")

    class Meta(exports.Meta):
        def info(self):
            return plugin_class().info()

    class Resolver(exports.Resolver):
        def can_resolve(self, reference):
            return plugin_class().can_resolve(reference)

        def resolve(self, reference):
            # The plugin is constructed inside the guard too: a raising `__init__` is an
            # error value, not a trap.
            return _guarded(lambda: plugin_class().resolve(reference))

    class Executor(exports.Executor):
        def execute(self, ctx, call, definition):
            return _guarded(lambda: plugin_class().execute(ctx, call, definition))

    return Meta, Resolver, Executor
