"""Round-trip timing of the official A2A Python client (a2a-sdk 1.3.0) against a peer.

    python a2a_bench_client.py --url http://127.0.0.1:P --n 200 --warmup 20

The client is created once (card fetched once, connection reused), like warden resolves
once; then each iteration sends one message and reads the whole answer. Prints one JSON
object: {"n", "median_ms", "mean_ms", "p90_ms", "output"}.
"""

import argparse
import asyncio
import json
import statistics
import time
import uuid

from a2a.client import create_client
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument('--url', required=True)
    ap.add_argument('--n', type=int, default=200)
    ap.add_argument('--warmup', type=int, default=20)
    args = ap.parse_args()
    client = await create_client(args.url)

    async def once() -> str:
        req = SendMessageRequest(
            message=Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=[Part(text='ping')])
        )
        text = ''
        async for event in client.send_message(req):
            if event.HasField('task'):
                text = ''.join(p.text for a in event.task.artifacts for p in a.parts)
        return text

    for _ in range(args.warmup):
        await once()
    samples = []
    out = ''
    for _ in range(args.n):
        t = time.perf_counter()
        out = await once()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    print(json.dumps({
        'n': args.n,
        'median_ms': statistics.median(samples),
        'mean_ms': statistics.fmean(samples),
        'p90_ms': samples[int(len(samples) * 0.9) - 1],
        'output': out,
    }))


if __name__ == '__main__':
    asyncio.run(main())
