# The egress forwarder of a session container (`sandbox.egress`): listens on
# 127.0.0.1:<port>, the address HTTP_PROXY/HTTPS_PROXY name, and relays each connection,
# byte for byte, to warden's proxy through the unix socket the host mounts into this
# container only. It decides nothing (the proxy does); it has no other way out (the
# container has no network). Run by the host as its own unprivileged user, so the agents'
# sweeps of the sandbox user leave it alone and sandboxed code cannot signal it.
# Before the container is handed to a session the socket does not exist yet: connections
# are closed at once.
import asyncio
import sys

PORT, SOCK = int(sys.argv[1]), sys.argv[2]
CHUNK = 64 * 1024


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except Exception:
        pass
    finally:
        try:
            writer.write_eof()
        except Exception:
            pass


async def handle(client_r, client_w):
    try:
        up_r, up_w = await asyncio.open_unix_connection(SOCK)
    except OSError:
        client_w.close()
        return
    try:
        await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))
    finally:
        client_w.close()
        up_w.close()


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", PORT, backlog=128)
    async with server:
        await server.serve_forever()


asyncio.run(main())
