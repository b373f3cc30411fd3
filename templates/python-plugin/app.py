"""`python-plugin`: a minimal warden protocol plugin in Python (componentize-py).

Serves kind `TEMPLATE`: resolves any reference of that kind to a subagent named after
the last segment of its URI (or `metadata.name`), and `execute` returns the prompt in
upper case. `warden_guest` (the SDK, next to this file) has the error classes and the
host helpers. Build:

    componentize-py -d wit -w plugin componentize app -o python-plugin.wasm

and try it without a deployment:

    warden plugin test python-plugin.wasm --ref template://hello --prompt "hi"
"""

import warden_guest as wg
from wit_world.imports import types

NAME = "python-plugin"
KIND = "TEMPLATE"


class Template(wg.Plugin):
    def info(self) -> types.PluginInfo:
        # Request only the capabilities you use; the operator grants them per plugin.
        return types.PluginInfo(name=NAME, version="0.1.0", kinds=[KIND], capabilities=[])

    def can_resolve(self, reference: types.SubagentReference) -> bool:
        return reference.kind == KIND

    def resolve(self, reference: types.SubagentReference) -> types.SubagentDefinition:
        if reference.kind != KIND:
            raise wg.InvalidInput(f"kind {reference.kind} is not {KIND}")
        meta = wg.Metadata.of(reference)
        name = meta.get("name") or reference.uri.replace(":", "/").rstrip("/").rsplit("/", 1)[-1]
        # The typed host fields (tools, permission_mode, mcp_servers, egress) start unset;
        # pass them as keywords when the subagent asks the host for them.
        return wg.definition(name, meta.get("description", "Answers in upper case"), reference)

    def execute(
        self,
        ctx: types.TaskContext,
        call: types.TaskCall,
        definition: types.SubagentDefinition,
    ) -> str:
        if not call.prompt:
            raise wg.InvalidInput("prompt: expected some text")
        return call.prompt.upper()


# componentize-py exports the classes named after the WIT interfaces.
Meta, Resolver, Executor = wg.export(Template)
