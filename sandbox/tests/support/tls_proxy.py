"""A TLS-terminating proxy in front of a unix socket, for the sandbox tests' second Docker
host: listens on 127.0.0.1:PORT, requires a client certificate signed by CA, and pipes each
connection to SOCKET. Usage: tls_proxy.py PORT CERT KEY CA SOCKET

socat's OPENSSL-LISTEN does not serve TLS 1.3 resumption with client verification
("session id context uninitialized"), and rustls (bollard) resumes; Python's ssl sets a
session id context, so resumed connections keep working."""

import asyncio
import ssl
import sys


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main():
    port, cert, key, ca, socket = sys.argv[1:6]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(ca)
    ctx.verify_mode = ssl.CERT_REQUIRED

    async def serve(client_reader, client_writer):
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(socket)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, up_writer), pipe(up_reader, client_writer))

    server = await asyncio.start_server(serve, "127.0.0.1", int(port), ssl=ctx)
    async with server:
        await server.serve_forever()


asyncio.run(main())
