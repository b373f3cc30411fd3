"""`wasi-probe` test plugin (Python, built with componentize-py).

It imports WASI. `execute` tries to reach the outside world through every door
Python offers (filesystem, environment, sockets, processes) and returns a JSON
object mapping each probe to "ok" (it got something: a sandbox leak) or
"error: <message>". The host's deny-all WASI context must make every probe fail.

With the prompt `nondeterministic` it is, on purpose, a plugin that does not run the
same way twice: it logs 8 bytes drawn from WASI's random source, then sleeps 3 s. A
durable task of it taken over must fail naming the first call that differs from its
journal, never go on with answers meant for other calls.
"""

import json
import os

import warden_guest as wg
from wit_world.imports import types


def _listdir():
    entries = os.listdir("/")
    if not entries:
        raise RuntimeError("empty listing")
    return entries


def _read(path):
    with open(path) as f:
        return f.read()


def _environ():
    env = dict(os.environ)
    if not env:
        raise RuntimeError("empty environment")
    return env


def _socket():
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(("127.0.0.1", 22))
    finally:
        s.close()


def _subprocess():
    import subprocess

    return subprocess.run(["/bin/sh", "-c", "id"], capture_output=True).stdout


def _system():
    status = os.system("id")
    if status != 0:
        raise RuntimeError(f"exit status {status}")


PROBES = [
    ("listdir", _listdir),
    ("passwd", lambda: _read("/etc/passwd")),
    ("hostname", lambda: _read("/etc/hostname")),
    ("environ", _environ),
    ("socket", _socket),
    ("subprocess", _subprocess),
    ("system", _system),
]


def run_probes():
    results = {}
    for name, probe in PROBES:
        try:
            probe()
            results[name] = "ok"
        except BaseException as e:  # noqa: BLE001 - every failure is the expected outcome
            results[name] = f"error: {type(e).__name__}: {e}"
    return results


class Probe(wg.Plugin):
    def info(self) -> types.PluginInfo:
        return types.PluginInfo(
            name="wasi-probe", version="0.1.0", kinds=["WASI-PROBE"], capabilities=[]
        )

    def can_resolve(self, reference: types.SubagentReference) -> bool:
        return reference.kind == "WASI-PROBE"

    def resolve(self, reference: types.SubagentReference) -> types.SubagentDefinition:
        if reference.kind != "WASI-PROBE":
            raise wg.InvalidInput(f"kind {reference.kind} is not WASI-PROBE")
        meta = wg.Metadata.of(reference)
        name = meta.get("name") or reference.uri.replace(":", "/").rsplit("/", 1)[-1]
        return wg.definition(name, meta.get("description", "Probes the WASI sandbox"), reference)

    def execute(
        self,
        ctx: types.TaskContext,
        call: types.TaskCall,
        definition: types.SubagentDefinition,
    ) -> str:
        if call.prompt == "nondeterministic":
            drawn = os.urandom(8).hex()
            wg.log.info(f"drew {drawn}")
            wg.clock.sleep(3000)
            return f"drew {drawn}"
        return json.dumps(run_probes(), sort_keys=True)


Meta, Resolver, Executor = wg.export(Probe)
