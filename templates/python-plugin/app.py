"""`python-plugin`: a minimal warden protocol plugin in Python (componentize-py).

Serves kind `TEMPLATE`: resolves any reference of that kind to a subagent named after
the last segment of its URI (or `metadata.name`), and `execute` returns the prompt in
upper case. Build:

    componentize-py -d wit -w plugin componentize app -o python-plugin.wasm

and try it without a deployment:

    warden plugin test python-plugin.wasm --ref template://hello --prompt "hi"
"""

from wit_world import exports
from wit_world.imports import types
from componentize_py_types import Err

NAME = "python-plugin"
KIND = "TEMPLATE"


class Meta(exports.Meta):
    def info(self) -> types.PluginInfo:
        # Request only the capabilities you use; the operator grants them per plugin.
        return types.PluginInfo(name=NAME, version="0.1.0", kinds=[KIND], capabilities=[])


class Resolver(exports.Resolver):
    def can_resolve(self, reference: types.SubagentReference) -> bool:
        return reference.kind == KIND

    def resolve(self, reference: types.SubagentReference) -> types.SubagentDefinition:
        if reference.kind != KIND:
            raise Err(types.Error_InvalidInput(f"kind {reference.kind} is not {KIND}"))
        meta = dict(reference.metadata)
        name = meta.get("name") or reference.uri.replace(":", "/").rstrip("/").rsplit("/", 1)[-1]
        return types.SubagentDefinition(
            name=name,
            description=meta.get("description", "Answers in upper case"),
            kind=reference.kind,
            reference=reference,
            protocol_data="{}",
        )


class Executor(exports.Executor):
    def execute(
        self,
        ctx: types.TaskContext,
        call: types.TaskCall,
        definition: types.SubagentDefinition,
    ) -> str:
        if not call.prompt:
            raise Err(types.Error_InvalidInput("prompt: expected some text"))
        return call.prompt.upper()
