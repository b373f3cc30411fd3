"""Real A2A peers for warden's tests, built with the official `a2a-sdk` (1.3.0).

    python a2a_agents.py --port P --agent echo|slow-stream|ask-input|fail [--protocol 1.0|0.3]
                         [--token T] [--steps N] [--step-delay S]

Agents:
- echo         answers "echo: <input>" as an artifact (card: streaming false).
- slow-stream  reports `working` N times (one status message per step, `--step-delay` apart),
               streams one artifact chunk per step, then completes (card: streaming true).
- ask-input    first turn: `input-required` with the question "What is your name?";
               a follow-up on the same task answers "Hello, <input>!" (card: streaming false).
- fail         fails with the status message "the fail agent always fails" (card: streaming false).

`--protocol 1.0` serves the 1.0 card (`supportedInterfaces`) and only the 1.0 JSON-RPC
methods. `--protocol 0.3` serves a 0.3-shaped card (`url`, `preferredTransport`,
`protocolVersion: 0.3.0`) and only the 0.3 methods, through the SDK's v0.3 compatibility
layer (1.0 method names are refused with JSON-RPC -32601, so a test knows which dialect it got).

`--token T` requires `Authorization: Bearer T` on the JSON-RPC endpoint (not on the card).

`GET /debug/log` returns what the peer saw, for assertions: every JSON-RPC call as
`{method, message_id, task_id, context_id, a2a_version, auth}` and every cancel as
`{method: "cancel", task_id}`.
"""

import argparse
import asyncio
import json

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from a2a.compat.v0_3.conversions import to_compat_agent_card
from a2a.helpers import new_task_from_user_message, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    TaskState,
)

V10_METHODS = {'SendMessage', 'SendStreamingMessage', 'GetTask', 'CancelTask', 'SubscribeToTask'}
V03_METHODS = {'message/send', 'message/stream', 'tasks/get', 'tasks/cancel', 'tasks/resubscribe'}

LOG: list[dict] = []


class Agents(AgentExecutor):
    def __init__(self, agent: str, steps: int, step_delay: float):
        self.agent = agent
        self.steps = steps
        self.step_delay = step_delay

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        text = context.get_user_input()

        def say(s: str):
            return updater.new_agent_message([new_text_part(s)])

        if self.agent == 'echo':
            await updater.add_artifact([new_text_part(f'echo: {text}')], name='echo')
            await updater.complete()
        elif self.agent == 'slow-stream':
            await updater.start_work(say('starting'))
            for i in range(1, self.steps + 1):
                await asyncio.sleep(self.step_delay)
                await updater.update_status(TaskState.TASK_STATE_WORKING, say(f'step {i}/{self.steps}'))
                await updater.add_artifact(
                    [new_text_part(f'part{i} ')],
                    artifact_id='result',
                    name='result',
                    append=i > 1,
                    last_chunk=i == self.steps,
                )
            await updater.complete(say('done'))
        elif self.agent == 'ask-input':
            answered = task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            if not answered:
                await updater.requires_input(say('What is your name?'))
            else:
                await updater.add_artifact([new_text_part(f'Hello, {text}!')], name='greeting')
                await updater.complete()
        elif self.agent == 'fail':
            await updater.start_work()
            await updater.failed(say('the fail agent always fails'))
        else:
            raise ValueError(f'unknown agent {self.agent}')

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        LOG.append({'method': 'cancel', 'task_id': context.task_id})
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


def card(agent: str, url: str) -> AgentCard:
    return AgentCard(
        name=f'{agent} agent',
        description=f'The {agent} test agent',
        version='1.0.0',
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding='JSONRPC', protocol_version='1.0'),
        ],
        capabilities=AgentCapabilities(streaming=agent == 'slow-stream'),
        default_input_modes=['text/plain'],
        default_output_modes=['text/plain'],
        skills=[AgentSkill(id=agent, name=agent, description=f'{agent} skill', tags=['test'])],
    )


def guard(app, protocol: str, token: str | None):
    """ASGI wrapper: logs JSON-RPC calls, pins the dialect, checks the bearer token."""
    allowed = V10_METHODS if protocol == '1.0' else V03_METHODS

    async def wrapped(scope, receive, send):
        if scope['type'] != 'http' or scope['method'] != 'POST' or scope['path'] != '/':
            return await app(scope, receive, send)
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get('body', b''))
            if not msg.get('more_body'):
                break
        body = b''.join(chunks)
        headers = {k.decode().lower(): v.decode() for k, v in scope['headers']}
        try:
            req = json.loads(body)
        except ValueError:
            req = {}
        method = req.get('method') if isinstance(req, dict) else None
        params = req.get('params') or {} if isinstance(req, dict) else {}
        message = params.get('message') or {} if isinstance(params, dict) else {}
        LOG.append({
            'method': method,
            'message_id': message.get('messageId'),
            'task_id': message.get('taskId') or params.get('id'),
            'context_id': message.get('contextId'),
            'a2a_version': headers.get('a2a-version'),
            'auth': headers.get('authorization') is not None,
        })

        async def reply(obj, status=200):
            data = json.dumps(obj).encode()
            await send({'type': 'http.response.start', 'status': status,
                        'headers': [(b'content-type', b'application/json')]})
            await send({'type': 'http.response.body', 'body': data})

        if token is not None and headers.get('authorization') != f'Bearer {token}':
            return await reply({'error': 'unauthorized'}, 401)
        if method not in allowed:
            return await reply({'jsonrpc': '2.0', 'id': req.get('id') if isinstance(req, dict) else None,
                                'error': {'code': -32601, 'message': f'Method not found: {method} '
                                          f'(this peer speaks A2A {protocol})'}})
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {'type': 'http.request', 'body': body, 'more_body': False}
            return await receive()

        return await app(scope, replay, send)

    return wrapped


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument('--port', type=int, required=True)
    ap.add_argument('--agent', required=True, choices=['echo', 'slow-stream', 'ask-input', 'fail'])
    ap.add_argument('--protocol', default='1.0', choices=['1.0', '0.3'])
    ap.add_argument('--token')
    ap.add_argument('--steps', type=int, default=3)
    ap.add_argument('--step-delay', type=float, default=0.2)
    args = ap.parse_args()

    url = f'http://127.0.0.1:{args.port}/'
    agent_card = card(args.agent, url)
    handler = DefaultRequestHandler(
        agent_executor=Agents(args.agent, args.steps, args.step_delay),
        task_store=InMemoryTaskStore(),
        agent_card=agent_card,
    )
    routes = create_jsonrpc_routes(handler, '/', enable_v0_3_compat=args.protocol == '0.3')
    if args.protocol == '1.0':
        routes += create_agent_card_routes(agent_card)
    else:
        legacy = to_compat_agent_card(
            AgentCard(
                name=agent_card.name, description=agent_card.description, version=agent_card.version,
                supported_interfaces=[AgentInterface(url=url, protocol_binding='JSONRPC', protocol_version='0.3.0')],
                capabilities=agent_card.capabilities,
                default_input_modes=agent_card.default_input_modes,
                default_output_modes=agent_card.default_output_modes,
                skills=agent_card.skills,
            )
        ).model_dump(mode='json', by_alias=True, exclude_none=True)

        async def legacy_card(_: Request):
            return JSONResponse(legacy)

        routes.append(Route('/.well-known/agent-card.json', legacy_card, methods=['GET']))

    async def debug_log(_: Request):
        return JSONResponse(LOG)

    routes.append(Route('/debug/log', debug_log, methods=['GET']))
    app = guard(Starlette(routes=routes), args.protocol, args.token)
    uvicorn.run(app, host='127.0.0.1', port=args.port, log_level='warning')


if __name__ == '__main__':
    main()
