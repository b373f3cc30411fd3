"""A parent agent's side of warden's MCP server, driven by the official `mcp` Python SDK
(2.3.0) client — the code desktop and CLI agents build on — for warden's e2e tests.

    python mcp_parent_client.py --transport stdio --mcp-json FILE --mode legacy SCENARIO...
    python mcp_parent_client.py --transport http --url http://127.0.0.1:PORT/mcp --mode auto SCENARIO...

Scenarios (run in order, one JSON line each on stdout):
  list                  the tools and their input schemas
  call:TOOL:PROMPT      call a tool; progress messages, content, structured content, the
                        text of every resource link read back with resources/read
  approve:TOOL:PROMPT   the same, answering every elicitation with decision=approve
  decline:TOOL:PROMPT   the same, answering every elicitation with decision=decline
  cancel:TOOL:PROMPT    call a tool and cancel the call once the task runs a tool; the
                        task id (from progress) is printed, with its record (--api)

--server-exit-wait S: after closing the server's stdin the SDK waits 2 s for it to exit,
then sends SIGTERM, then SIGKILL 2 s later; this waits S seconds instead, so a test can
check what the server does on its own when its client goes (with no timing in it).
"""

import argparse
import json
import sys

import urllib.request

import anyio
from mcp import StdioServerParameters, types
from mcp.client.client import Client


def emit(obj):
    print(json.dumps(obj), flush=True)


def content_json(result):
    out = []
    for c in result.content:
        out.append(c.model_dump(mode="json", by_alias=True, exclude_none=True))
    return out


async def run_scenario(client, scenario, answers):
    kind, _, rest = scenario.partition(":")
    if kind == "list":
        tools = await client.list_tools()
        emit({"scenario": "list", "tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools.tools]})
        return
    tool, _, prompt = rest.partition(":")
    progress = []

    async def on_progress(p, total, message):
        progress.append(message or "")

    if kind == "cancel":
        task_id = {"id": None}
        async with anyio.create_task_group() as tg:
            async def watch():
                with anyio.fail_after(120):
                    while not any(m.startswith("tool call:") for m in progress):
                        await anyio.sleep(0.05)
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            try:
                await client.call_tool(tool, {"prompt": prompt}, progress_callback=on_progress)
            except Exception as e:  # noqa: BLE001 - reported to the test
                emit({"scenario": scenario, "unexpected": repr(e)})
        for m in progress:
            if "(task " in m:
                task_id["id"] = m.split("(task ", 1)[1].rstrip(")")
        record = None
        if answers.get("api") and task_id["id"]:
            # The task's record as the HTTP API shows it once it ended (waits up to 30 s).
            url = f"{answers['api']}/v1/tasks/{task_id['id']}?timeout_ms=30000"
            record = await anyio.to_thread.run_sync(lambda: json.loads(urllib.request.urlopen(url, timeout=60).read()))
        emit({"scenario": scenario, "progress": progress, "task_id": task_id["id"], "record": record})
        return

    answers["decision"] = {"approve": "approve", "decline": "decline"}.get(kind)
    answers["asked"] = []
    result = await client.call_tool(tool, {"prompt": prompt}, progress_callback=on_progress)
    files = {}
    for c in result.content:
        if c.type == "resource_link":
            read = await client.read_resource(str(c.uri))
            files[str(c.uri)] = [getattr(x, "text", None) for x in read.contents]
    events = None
    task_id = (result.structured_content or {}).get("task_id")
    if answers.get("api") and task_id:
        # The finished task's event stream from the HTTP API (replayed, then it ends).
        url = f"{answers['api']}/v1/tasks/{task_id}/events"
        raw = await anyio.to_thread.run_sync(lambda: urllib.request.urlopen(url, timeout=60).read().decode())
        events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    emit({
        "scenario": scenario,
        "events": events,
        "is_error": result.is_error,
        "content": content_json(result),
        "structured": result.structured_content,
        "progress": progress,
        "files": files,
        "asked": answers["asked"],
    })


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", choices=["stdio", "http"], required=True)
    ap.add_argument("--mcp-json", help="an .mcp.json file; its `warden` server is launched")
    ap.add_argument("--url")
    ap.add_argument("--mode", default="auto")
    ap.add_argument("--api", help="warden's HTTP API, where a canceled task's record is read")
    ap.add_argument("--server-exit-wait", type=float)
    ap.add_argument("scenarios", nargs="+")
    args = ap.parse_args()
    if args.server_exit_wait is not None:
        import mcp.client.stdio

        assert hasattr(mcp.client.stdio, "PROCESS_TERMINATION_TIMEOUT"), "the SDK renamed its exit wait"
        mcp.client.stdio.PROCESS_TERMINATION_TIMEOUT = args.server_exit_wait

    answers = {"decision": None, "asked": [], "api": args.api}

    async def on_elicit(context, params):
        answers["asked"].append(params.message)
        if answers["decision"] is None:
            return types.ElicitResult(action="cancel")
        return types.ElicitResult(action="accept", content={"decision": answers["decision"]})

    if args.transport == "stdio":
        with open(args.mcp_json) as f:
            entry = json.load(f)["mcpServers"]["warden"]
        server = StdioServerParameters(command=entry["command"], args=entry.get("args", []), env=entry.get("env"))
    else:
        server = args.url
    async with Client(server, mode=args.mode, elicitation_callback=on_elicit, read_timeout_seconds=300) as client:
        emit({"scenario": "connected", "protocol_version": client.protocol_version})
        for s in args.scenarios:
            await run_scenario(client, s, answers)


if __name__ == "__main__":
    try:
        anyio.run(main)
    except Exception as e:  # noqa: BLE001 - the test prints it
        print(f"mcp_parent_client failed: {e!r}", file=sys.stderr)
        raise
