"""MCP peer for the e2e tests, built with the official SDK (PyPI `mcp` 2.3.0).

Serves streamable HTTP at `/mcp` on 127.0.0.1:

- `agent(prompt)`: the agent tool (one string argument). Reports two progress
  notifications, then answers `agent answered: <prompt>` in two text blocks.
- `fail(prompt, reason="...")`: raises `ToolError` -> a result with `isError: true`.
- `slow(prompt, seconds=30)`: reports progress, then sleeps (deadline tests).
- `add(a, b)`: a non-agent tool with a typed schema (tool-listing tests).

Revisions:
- default: the SDK serves every revision it knows on one endpoint: 2026-07-28
  (`server/discover`, per-request `_meta`) and the handshake revisions
  (`initialize`, `Mcp-Session-Id`).
- `--legacy`: behaves like a deployment of an SDK that predates 2026-07-28. The
  SDK has no switch for that, so a small ASGI wrapper hides the modern
  `MCP-Protocol-Version` header: every request then reaches the SDK's own
  handshake-era transport, which answers a `server/discover` probe the way such a
  server does (stateful: 400 "Missing session ID"; `--stateless`: JSON-RPC error).

Usage: mcp_server.py --port P [--legacy] [--stateless] [--json-response] [--name N]
"""

import argparse
import logging

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS


def build(name: str) -> MCPServer:
    server = MCPServer(name=name, version="1.0.0", instructions="A test agent served over MCP.")

    @server.tool(description="Answers a question like an agent would.")
    async def agent(prompt: str, ctx: Context) -> str:
        await ctx.report_progress(1, 2, "thinking")
        await ctx.report_progress(2, 2, "writing")
        return f"agent answered: {prompt}"

    @server.tool(description="Always fails with a tool error.")
    async def fail(prompt: str, reason: str = "the tool refused") -> str:
        raise ToolError(f"{reason}: {prompt}")

    @server.tool(description="Reports progress, then takes its time.")
    async def slow(prompt: str, ctx: Context, seconds: float = 30.0) -> str:
        await ctx.report_progress(0, 1, "started")
        await anyio.sleep(seconds)
        return f"slow answered: {prompt}"

    @server.tool(description="Adds two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    return server


class HandshakeOnly:
    """Hides modern (non-handshake) MCP-Protocol-Version headers from the SDK."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = [
                (k, v)
                for k, v in scope["headers"]
                if k != b"mcp-protocol-version" or v.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS
            ]
            scope = dict(scope, headers=headers)
        await self.app(scope, receive, send)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--legacy", action="store_true", help="serve only the handshake revisions")
    parser.add_argument("--stateless", action="store_true", help="no Mcp-Session-Id (handshake revisions)")
    parser.add_argument("--json-response", action="store_true", help="application/json instead of SSE")
    parser.add_argument("--name", default="test-agents")
    args = parser.parse_args()
    logging.getLogger("mcp").setLevel(logging.WARNING)  # no per-session chatter in test output

    app = build(args.name).streamable_http_app(
        json_response=args.json_response, stateless_http=args.stateless
    )
    if args.legacy:
        app = HandshakeOnly(app)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
