"""A parent agent driving warden's A2A server with the official A2A client (a2a-sdk 1.3.0).

    python a2a_parent_client.py --base http://127.0.0.1:P [--only SCENARIO]...
    python a2a_parent_client.py --base http://127.0.0.1:P --token-a T1 --token-b T2

Runs every scenario against the subagents of the e2e deployment (tests/tests/e2e/a2a_server.rs:
`greeter`, `gated`, `writer`, `sleeper`) and prints one JSON object, scenario -> what the client
saw, or {"error": "..."} when the scenario raised. With two principals' tokens it runs the
`principals` scenario instead (alice's task is invisible to bob). The Rust test asserts on it; this script
asserts nothing itself, so a failure reads as data, not as a Python traceback.

Both generations of the client are the SDK's own: the 1.0 `JsonRpcTransport` chosen by
`ClientFactory` from the card, and the 0.3 `CompatJsonRpcTransport` the same factory picks for a
card that has only the 0.3 fields (`url`, `preferredTransport`, `protocolVersion`), after the
card was validated with the SDK's 0.3 `AgentCard` model.
"""

import argparse
import asyncio
import json
import traceback
import uuid

import httpx

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.card_resolver import parse_agent_card
from a2a.compat.v0_3 import types as types_v03
from a2a.helpers import get_data_parts, get_text_parts, new_data_part, new_text_part
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)

BASE = ''
# Bearer tokens of two principals (`--token-a`, `--token-b`); without them the API is open.
TOKENS = {'a': None, 'b': None}


def headers(who: str = 'a') -> dict:
    token = TOKENS[who]
    return {'Authorization': f'Bearer {token}'} if token else {}


def http(who: str = 'a') -> httpx.AsyncClient:
    return httpx.AsyncClient(headers=headers(who))


def config(streaming: bool, who: str = 'a') -> ClientConfig:
    return ClientConfig(streaming=streaming, httpx_client=http(who))


def agent_url(agent: str) -> str:
    return f'{BASE}/a2a/{agent}'


def user_message(text=None, *, context_id='', task_id='', data=None) -> Message:
    parts = []
    if text is not None:
        parts.append(new_text_part(text))
    if data is not None:
        parts.append(new_data_part(data))
    return Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=parts,
                   context_id=context_id, task_id=task_id)


def task_summary(t: Task) -> dict:
    return {
        'id': t.id,
        'context_id': t.context_id,
        'state': TaskState.Name(t.status.state),
        'status_text': '\n'.join(get_text_parts(t.status.message.parts)),
        'status_data': get_data_parts(t.status.message.parts),
        'artifacts': ['\n'.join(get_text_parts(a.parts)) for a in t.artifacts],
    }


def event_summary(ev: StreamResponse) -> dict:
    which = ev.WhichOneof('payload')
    if which == 'task':
        return {'kind': 'task', **task_summary(ev.task)}
    if which == 'status_update':
        u = ev.status_update
        return {'kind': 'status', 'task_id': u.task_id, 'context_id': u.context_id,
                'state': TaskState.Name(u.status.state),
                'text': '\n'.join(get_text_parts(u.status.message.parts)),
                'data': get_data_parts(u.status.message.parts)}
    if which == 'artifact_update':
        u = ev.artifact_update
        return {'kind': 'artifact', 'task_id': u.task_id,
                'text': '\n'.join(get_text_parts(u.artifact.parts)), 'last_chunk': u.last_chunk}
    if which == 'message':
        return {'kind': 'message', 'text': '\n'.join(get_text_parts(ev.message.parts))}
    return {'kind': str(which)}


def error_summary(e: BaseException) -> dict:
    return {'error_type': type(e).__name__, 'message': str(e)}


async def card_of(agent: str, who: str = 'a'):
    async with http(who) as h:
        return await A2ACardResolver(h, agent_url(agent)).get_agent_card()


async def client_v1(agent: str, streaming: bool, who: str = 'a'):
    """The 1.0 client, as `ClientFactory` builds it from the card."""
    card = await card_of(agent, who)
    return ClientFactory(config(streaming, who)).create(card)


async def legacy_card(agent: str):
    """What a 0.3 client sees: the card validated with the SDK's 0.3 model, then only its
    0.3 fields (`url`, `preferredTransport`, `protocolVersion`) turned into the client's card."""
    async with http() as h:
        r = await h.get(f'{agent_url(agent)}/.well-known/agent-card.json')
        r.raise_for_status()
        raw = r.json()
    v03 = types_v03.AgentCard.model_validate(raw)
    legacy = {k: v for k, v in raw.items() if k != 'supportedInterfaces'}
    return v03, parse_agent_card(legacy)


async def client_v03(agent: str, streaming: bool):
    _, card = await legacy_card(agent)
    return ClientFactory(config(streaming)).create(card)


async def send(client, message: Message, *, return_immediately=False) -> list:
    req = SendMessageRequest(message=message,
                             configuration=SendMessageConfiguration(return_immediately=return_immediately))
    return [event_summary(ev) async for ev in client.send_message(req)]


async def file_of(context_id: str, path: str, who: str = 'a') -> dict:
    async with http(who) as h:
        r = await h.get(f'{BASE}/v1/sessions/{context_id}/files/{path}')
        return {'status': r.status_code, 'text': r.text}


# --- scenarios ---------------------------------------------------------------------------------

async def discovery() -> dict:
    async with httpx.AsyncClient() as h:
        directory = (await h.get(f'{BASE}/a2a')).json()
    card = await card_of('greeter')
    c1 = ClientFactory(ClientConfig(streaming=False)).create(card)
    v03, legacy = await legacy_card('greeter')
    c03 = ClientFactory(ClientConfig(streaming=False)).create(legacy)
    return {
        'directory': sorted(c['name'] for c in directory),
        'v1': {
            'name': card.name,
            'description': card.description,
            'streaming': card.capabilities.streaming,
            'skills': [s.id for s in card.skills],
            'interfaces': [[i.url, i.protocol_binding, i.protocol_version] for i in card.supported_interfaces],
            'transport': type(c1._transport).__name__,
            'transport_url': c1._transport.url,
        },
        'v03': {
            'url': v03.url,
            'preferred_transport': v03.preferred_transport,
            'protocol_version': v03.protocol_version,
            'interfaces': [[i.url, i.protocol_binding, i.protocol_version] for i in legacy.supported_interfaces],
            'transport': type(c03._transport).__name__,
        },
    }


async def send_get_list_v1() -> dict:
    client = await client_v1('greeter', streaming=False)
    sent = await send(client, user_message('hello there'))
    task_id = sent[-1].get('id', '')
    got = task_summary(await client.get_task(GetTaskRequest(id=task_id)))
    listed = await client.list_tasks(ListTasksRequest())
    by_context = await client.list_tasks(ListTasksRequest(context_id=sent[-1].get('context_id', '')))
    try:
        await client.get_task(GetTaskRequest(id='task_does-not-exist'))
        missing = {'error_type': None}
    except Exception as e:  # noqa: BLE001
        missing = error_summary(e)
    return {
        'sent': sent,
        'got': got,
        'listed': [t.id for t in listed.tasks],
        'listed_total': listed.total_size,
        'by_context': [t.id for t in by_context.tasks],
        'missing': missing,
    }


async def send_get_v03() -> dict:
    client = await client_v03('greeter', streaming=False)
    sent = await send(client, user_message('hello from an 0.3 client'))
    task_id = sent[-1].get('id', '')
    got = task_summary(await client.get_task(GetTaskRequest(id=task_id)))
    return {'sent': sent, 'got': got}


async def stream_v1() -> dict:
    client = await client_v1('greeter', streaming=True)
    return {'events': await send(client, user_message('stream me a greeting'))}


async def stream_v03() -> dict:
    client = await client_v03('greeter', streaming=True)
    return {'events': await send(client, user_message('stream me a greeting, 0.3 style'))}


async def cancel() -> dict:
    client = await client_v1('sleeper', streaming=False)
    started = await send(client, user_message('sleep for a minute'), return_immediately=True)
    task_id = started[-1]['id']
    # Wait until the subagent's tool runs, then watch the task while canceling it.
    state = ''
    for _ in range(300):
        state = TaskState.Name((await client.get_task(GetTaskRequest(id=task_id))).status.state)
        if state == 'TASK_STATE_WORKING':
            break
        await asyncio.sleep(0.1)
    watcher = await client_v1('sleeper', streaming=True)

    async def watch():
        return [event_summary(ev) async for ev in watcher.subscribe(SubscribeToTaskRequest(id=task_id))]

    watching = asyncio.create_task(watch())
    await asyncio.sleep(1.0)
    canceled = task_summary(await client.cancel_task(CancelTaskRequest(id=task_id)))
    watched = await asyncio.wait_for(watching, 30)
    after = task_summary(await client.get_task(GetTaskRequest(id=task_id)))
    try:
        await client.cancel_task(CancelTaskRequest(id=task_id))
        again = {'error_type': None}
    except Exception as e:  # noqa: BLE001
        again = error_summary(e)
    return {'started': started, 'state_before': state, 'canceled': canceled, 'watched': watched,
            'after': after, 'cancel_again': again}


async def approve_v1() -> dict:
    client = await client_v1('gated', streaming=False)
    asked = await send(client, user_message('run the gated command'))
    task = asked[-1]
    try:
        await send(client, user_message('maybe', task_id=task['id']))
        unclear = {'error_type': None}
    except Exception as e:  # noqa: BLE001
        unclear = error_summary(e)
    still = task_summary(await client.get_task(GetTaskRequest(id=task['id'])))
    answered = await send(client, user_message('approve', task_id=task['id']))
    return {'asked': asked, 'unclear': unclear, 'still': still, 'answered': answered,
            'file': await file_of(task['context_id'], 'gate.txt')}


async def decline_stream_v03() -> dict:
    client = await client_v03('gated', streaming=True)
    asked = await send(client, user_message('run the gated command, 0.3 style'))
    task_id = next(e['task_id'] if e['kind'] != 'task' else e['id'] for e in asked)
    context_id = next(e['context_id'] for e in asked if e['kind'] in ('task', 'status'))
    request_id = next((d.get('request_id') for e in asked if e['kind'] == 'status' for d in e['data']), None)
    answered = await send(client, user_message(None, task_id=task_id,
                                               data={'decision': 'decline', 'request_id': request_id}))
    return {'asked': asked, 'request_id': request_id, 'answered': answered,
            'before': await file_of(context_id, 'before.txt'), 'file': await file_of(context_id, 'gate.txt')}


async def follow_up() -> dict:
    client = await client_v1('writer', streaming=False)
    first = await send(client, user_message('write a note'))
    context_id = first[-1]['context_id']
    second = await send(client, user_message('what does the note say?', context_id=context_id))
    return {'first': first, 'second': second, 'file': await file_of(context_id, 'note.txt')}


async def hostile() -> dict:
    out = {}
    async with httpx.AsyncClient() as h:
        async def rpc(body, agent='greeter', raw=False):
            r = await h.post(agent_url(agent), content=body if raw else json.dumps(body),
                             headers={'content-type': 'application/json'})
            try:
                return {'status': r.status_code, 'body': r.json()}
            except ValueError:
                return {'status': r.status_code, 'body': r.text}

        def req(method, params):
            return {'jsonrpc': '2.0', 'id': 1, 'method': method, 'params': params}

        msg = {'messageId': 'm', 'role': 'ROLE_USER', 'parts': [{'text': 'hi'}]}
        out['unknown_method'] = await rpc(req('tasks/pushNotificationConfig/set', {}))
        out['not_json'] = await rpc(b'{"jsonrpc": "2.0", "id": 1, "method": ', raw=True)
        out['batch'] = await rpc([req('GetTask', {'id': 'x'})])
        out['no_message'] = await rpc(req('SendMessage', {}))
        out['bad_context'] = await rpc(req('SendMessage', {'message': {**msg, 'contextId': '../../etc'}}))
        out['agent_role'] = await rpc(req('SendMessage', {'message': {**msg, 'role': 'ROLE_AGENT'}}))
        out['file_part'] = await rpc(req('SendMessage', {'message': {**msg, 'parts': [{'url': 'http://x/y'}]}}))
        out['missing_task'] = await rpc(req('GetTask', {'id': 'task_nope'}))
        out['answer_to_finished'] = await rpc(req('SendMessage', {'message': {**msg, 'taskId': 'task_nope'}}))
        out['unknown_agent'] = await rpc(req('GetTask', {'id': 'x'}), agent='nope')
        r = await h.post(agent_url('greeter'), content=json.dumps(req('GetTask', {'id': 'x'})),
                         headers={'content-type': 'application/json', 'A2A-Version': '9.0'})
        out['bad_version'] = {'status': r.status_code, 'body': r.json()}
        r = await h.get(f'{agent_url("greeter")}/.well-known/agent-card.json', headers={'Host': 'evil.example/x'})
        out['bad_host'] = {'status': r.status_code}
    return out


async def principals() -> dict:
    """Two principals (`--token-a` alice, `--token-b` bob): bob cannot see, cancel or
    answer alice's task; alice can."""
    async with httpx.AsyncClient() as h:
        anonymous = (await h.get(f'{agent_url("greeter")}/.well-known/agent-card.json')).status_code
    async with http('a') as h:
        bad_host = (await h.get(f'{agent_url("greeter")}/.well-known/agent-card.json',
                                headers={'Host': 'evil.example/x'})).status_code
    card = await card_of('gated', 'a')
    alice = await client_v1('gated', streaming=False, who='a')
    bob = await client_v1('gated', streaming=False, who='b')
    asked = (await send(alice, user_message('run the gated command')))[-1]

    async def attempt(call):
        try:
            await call
            return {'error_type': None}
        except Exception as e:  # noqa: BLE001
            return error_summary(e)

    seen_by_bob = {
        'get': await attempt(bob.get_task(GetTaskRequest(id=asked['id']))),
        'cancel': await attempt(bob.cancel_task(CancelTaskRequest(id=asked['id']))),
        'answer': await attempt(send(bob, user_message('approve', task_id=asked['id']))),
        'list': [t.id for t in (await bob.list_tasks(ListTasksRequest())).tasks],
        'file': (await file_of(asked['context_id'], 'before.txt', 'b'))['status'],
    }
    listed_by_alice = [t.id for t in (await alice.list_tasks(ListTasksRequest())).tasks]
    still = task_summary(await alice.get_task(GetTaskRequest(id=asked['id'])))
    answered = (await send(alice, user_message('yes', task_id=asked['id'])))[-1]
    return {
        'anonymous_card': anonymous,
        'bad_host': bad_host,
        'security': [list(r.schemes.keys()) for r in card.security_requirements],
        'asked': asked, 'bob': seen_by_bob, 'alice_list': listed_by_alice, 'still': still,
        'answered': answered, 'file': await file_of(asked['context_id'], 'gate.txt', 'a'),
    }


SCENARIOS = {
    'discovery': discovery,
    'send_get_list_v1': send_get_list_v1,
    'send_get_v03': send_get_v03,
    'stream_v1': stream_v1,
    'stream_v03': stream_v03,
    'approve_v1': approve_v1,
    'decline_stream_v03': decline_stream_v03,
    'follow_up': follow_up,
    'cancel': cancel,
    'hostile': hostile,
}
# Scenarios that need `--token-a` and `--token-b` (a server with principals).
WITH_TOKENS = {'principals': principals}


async def relay() -> dict:
    """`asker` is a remote A2A agent served through warden's a2a plugin: its question ends the
    warden task input-required, and the answer on the same taskId resumes it (a new task)."""
    client = await client_v1('asker', streaming=False)
    asked = (await send(client, user_message('hi')))[-1]
    answered = (await send(client, user_message('Ada', task_id=asked['id'])))[-1]
    return {'asked': asked, 'answered': answered}


# Scenarios of their own deployments, run only when named with `--only`.
ON_REQUEST = {'relay': relay}


async def main() -> None:
    global BASE
    ap = argparse.ArgumentParser()
    ap.add_argument('--base', required=True)
    ap.add_argument('--only', action='append', help='run only these scenarios')
    ap.add_argument('--token-a', help="the first principal's bearer token")
    ap.add_argument('--token-b', help="the second principal's bearer token")
    args = ap.parse_args()
    BASE = args.base.rstrip('/')
    TOKENS['a'], TOKENS['b'] = args.token_a, args.token_b
    report = {}
    if args.only:
        every = {**SCENARIOS, **WITH_TOKENS, **ON_REQUEST}
        unknown = [n for n in args.only if n not in every]
        if unknown:
            raise SystemExit(f'unknown scenarios: {unknown}')
        scenarios = {n: every[n] for n in args.only}
    else:
        scenarios = WITH_TOKENS if args.token_a and args.token_b else SCENARIOS
    for name, scenario in scenarios.items():
        try:
            report[name] = await asyncio.wait_for(scenario(), 240)
        except BaseException as e:  # noqa: BLE001 - every failure is reported, not raised
            report[name] = {'error': f'{type(e).__name__}: {e}', 'trace': traceback.format_exc()}
    print(json.dumps(report))


if __name__ == '__main__':
    asyncio.run(main())
