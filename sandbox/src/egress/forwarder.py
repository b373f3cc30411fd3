# The egress forwarder of a session container (`sandbox.egress`). Two modes:
#   serve PORT SOCK  the daemon: listens on 127.0.0.1:PORT, the address HTTP_PROXY/HTTPS_PROXY
#                    name, and on the unix socket SOCK ("@name": an abstract one). Each
#                    connection on SOCK is a channel to one warden replica; over it the forwarder
#                    runs a yamux session as the client (hashicorp's spec; the host is the `yamux`
#                    crate in server mode) and relays each TCP connection, byte for byte, over a
#                    new stream of the preferred session: the last to claim it (a stream the host
#                    opens saying "claim\n", answered "ok\n"), else the last connected. With no
#                    session, connections are closed at once.
#   channel SOCK     run by each replica with `docker exec`: pipes its stdin/stdout (the exec's
#                    byte stream to the host) to SOCK and back, until either side ends.
# It decides nothing (the host's proxy does) and has no other way out (the container has no
# network). Both modes run as the forwarder's own unprivileged user, so the agents' sweeps of
# the sandbox user leave them alone and sandboxed code cannot signal them; as sandboxed code
# shares the container, each end of SOCK talks only to a peer of its own uid (SO_PEERCRED).
# A peer breaking the protocol loses its session; an unknown stream's frames are ignored.
# Exit codes: 2 channel's peer is not our uid, 3 channel cannot connect, 4 serve cannot bind SOCK.
import asyncio
import itertools
import os
import socket
import stat
import struct
import sys
import threading

HEADER = struct.Struct(">BBHII")
DATA, WINDOW_UPDATE, PING, GO_AWAY = range(4)
SYN, ACK, FIN, RST = 1, 2, 4, 8
WINDOW = 256 * 1024
CHUNK = 64 * 1024
MAX_STREAMS = 64
MAX_CLAIM = 64
PROTOCOL_ERROR = 1
SESSIONS = []
TICKS = itertools.count(1)


def peer_uid(sock):
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def unix_address(path):
    return "\0" + path[1:] if path.startswith("@") else path


class Stream:
    """A tool's TCP connection relayed over one of our streams (odd id)."""

    def __init__(self, session, sid, reader, writer):
        self.session, self.id, self.reader, self.writer = session, sid, reader, writer
        self.send_window = WINDOW
        self.recv_window = WINDOW
        self.granted = asyncio.Event()
        self.inbox = asyncio.Queue()
        self.remote_fin = self.done = False
        self.tasks = []

    async def run(self):
        self.session.send(WINDOW_UPDATE, SYN, self.id, 0)
        self.tasks = [asyncio.ensure_future(self.uplink()), asyncio.ensure_future(self.downlink())]
        await asyncio.wait(self.tasks)
        if not self.done:
            self.done = True
            self.session.streams.pop(self.id, None)
        self.writer.close()

    async def uplink(self):
        """TCP to yamux, never beyond the send window; the tool's EOF becomes our FIN."""
        session = self.session
        try:
            while True:
                while self.send_window <= 0:
                    self.granted.clear()
                    await self.granted.wait()
                data = await self.reader.read(min(CHUNK, self.send_window))
                if not data:
                    break
                self.send_window -= len(data)
                session.send(DATA, 0, self.id, len(data), data)
                await session.writer.drain()
            session.send(WINDOW_UPDATE, FIN, self.id, 0)
        except OSError:
            self.reset(True)

    async def downlink(self):
        """yamux to TCP; the window is given back as the tool takes the bytes; FIN: shutdown."""
        consumed = 0
        try:
            while (data := await self.inbox.get()) is not None:
                self.writer.write(data)
                await self.writer.drain()
                consumed += len(data)
                if consumed >= WINDOW // 2:
                    self.recv_window += consumed
                    self.session.send(WINDOW_UPDATE, 0, self.id, consumed)
                    consumed = 0
            self.writer.write_eof()
        except OSError:
            self.reset(True)

    def grant(self, delta):
        self.send_window += delta
        self.granted.set()

    def receive(self, data):
        if self.remote_fin:
            return
        if len(data) > self.recv_window:
            self.reset(True)
            return
        self.recv_window -= len(data)
        if data:
            self.inbox.put_nowait(data)

    def receive_fin(self):
        if not self.remote_fin:
            self.remote_fin = True
            self.inbox.put_nowait(None)

    def reset_by_host(self):
        """The host reset the stream: what it sent before still reaches the tool, then the
        connection ends (nothing more goes up)."""
        if self.done:
            return
        self.done = True
        self.session.streams.pop(self.id, None)
        if self.tasks:
            self.tasks[0].cancel()
        self.receive_fin()

    def reset(self, send):
        """Ends the stream (RST to the host when `send`) and the tool's connection."""
        if self.done:
            return
        self.done = True
        self.session.streams.pop(self.id, None)
        if send:
            self.session.send(WINDOW_UPDATE, RST, self.id, 0)
        for task in self.tasks:
            task.cancel()
        self.writer.transport.abort()


class Claim:
    """A stream the host opened (even id): "claim\\n" then FIN makes its session preferred."""

    def __init__(self, session, sid):
        self.session, self.id, self.data = session, sid, b""
        session.send(WINDOW_UPDATE, ACK, sid, 0)

    def grant(self, delta):
        pass

    def receive(self, data):
        self.data += data
        if len(self.data) > MAX_CLAIM:
            self.reset(True)

    def receive_fin(self):
        if self.session.streams.pop(self.id, None) is None:
            return
        if self.data == b"claim\n":
            self.session.claim = next(TICKS)
            self.session.send(DATA, FIN, self.id, 3, b"ok\n")
        else:
            self.session.send(WINDOW_UPDATE, RST, self.id, 0)

    def reset_by_host(self):
        self.reset(False)

    def reset(self, send):
        if self.session.streams.pop(self.id, None) is not None and send:
            self.session.send(WINDOW_UPDATE, RST, self.id, 0)


class Session:
    """One channel connection: a yamux session, we the client."""

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer
        self.arrival, self.claim = next(TICKS), 0
        self.streams = {}
        self.next_id = 1
        self.alive = True

    def send(self, kind, flags, sid, length, payload=b""):
        if self.alive and not self.writer.is_closing():
            self.writer.write(HEADER.pack(0, kind, flags, sid, length) + payload)

    def count(self, parity):
        return sum(1 for sid in self.streams if sid % 2 == parity)

    async def relay(self, reader, writer):
        sid, self.next_id = self.next_id, self.next_id + 2
        stream = self.streams[sid] = Stream(self, sid, reader, writer)
        await stream.run()

    async def serve(self):
        SESSIONS.append(self)
        try:
            while True:
                version, kind, flags, sid, length = HEADER.unpack(await self.reader.readexactly(12))
                if version != 0 or kind > GO_AWAY or (kind == DATA and length > WINDOW):
                    self.send(GO_AWAY, 0, 0, PROTOCOL_ERROR)
                    break
                payload = await self.reader.readexactly(length) if kind == DATA else b""
                if kind == PING:
                    if flags & SYN:
                        self.send(PING, ACK, 0, length)
                    continue
                if kind == GO_AWAY:
                    break
                stream = self.streams.get(sid)
                if stream is None and flags & SYN and sid % 2 == 0 and sid and not flags & RST:
                    stream = self.streams[sid] = Claim(self, sid)
                    if self.count(0) > MAX_STREAMS:
                        stream.reset(True)
                        continue
                if stream is None:
                    continue
                if flags & RST:
                    stream.reset_by_host()
                    continue
                if kind == WINDOW_UPDATE:
                    stream.grant(length)
                else:
                    stream.receive(payload)
                if flags & FIN:
                    stream.receive_fin()
        except (OSError, EOFError):
            pass
        finally:
            self.close()

    def close(self):
        if not self.alive:
            return
        self.alive = False
        SESSIONS.remove(self)
        for stream in list(self.streams.values()):
            stream.reset(False)
        self.writer.close()


def preferred():
    """The live session that claimed last, else the one connected last."""
    live = [s for s in SESSIONS if s.alive]
    return max(live, key=lambda s: (s.claim, s.arrival), default=None)


async def on_tool(reader, writer):
    session = preferred()
    if session is None or session.count(1) >= MAX_STREAMS:
        writer.close()
        return
    await session.relay(reader, writer)


async def on_channel(reader, writer):
    try:
        ours = peer_uid(writer.get_extra_info("socket")) == os.getuid()
    except OSError:
        ours = False
    if not ours:
        writer.transport.abort()
        return
    await Session(reader, writer).serve()


def own_directory(path):
    """Makes the directory of a socket path ours alone (0700), or refuses: a directory someone
    else made there (or a link) could hand the socket to them."""
    directory = os.path.dirname(path)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise OSError(f"{directory} is not a directory of this user alone")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def serve(port, path):
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not path.startswith("@"):
            own_directory(path)
        unix.bind(unix_address(path))
        unix.listen(16)
    except OSError as e:
        print(f"egress forwarder: cannot listen on {path}: {e}", file=sys.stderr)
        sys.exit(4)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("127.0.0.1", port))

    async def main():
        await asyncio.start_unix_server(on_channel, sock=unix)
        server = await asyncio.start_server(on_tool, sock=tcp, backlog=128)
        await server.serve_forever()

    asyncio.run(main())


def channel(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(unix_address(path))
    except OSError as e:
        print(f"egress channel: cannot connect to {path}: {e}", file=sys.stderr)
        sys.exit(3)
    if peer_uid(sock) != os.getuid():
        print(f"egress channel: {path} is not the forwarder's", file=sys.stderr)
        sys.exit(2)

    def down():
        try:
            while data := sock.recv(CHUNK):
                view = memoryview(data)
                while view:
                    view = view[os.write(1, view):]
        except OSError:
            pass
        os._exit(0)

    threading.Thread(target=down, daemon=True).start()
    try:
        while data := os.read(0, CHUNK):
            sock.sendall(data)
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    os._exit(0)


if sys.argv[1] == "serve":
    serve(int(sys.argv[2]), sys.argv[3])
elif sys.argv[1] == "channel":
    channel(sys.argv[2])
else:
    sys.exit(f"usage: serve PORT SOCK | channel SOCK (not {sys.argv[1:]})")
