"""Tests of the egress forwarder (sandbox/src/egress/forwarder.py) on this machine, without
Docker: runs `serve` as the forwarder's uid (65533) the way the host does (python3 -I -S -c,
comment and blank lines stripped), spawns `channel` processes and plays the host's side of
each: a small yamux server over the channel's stdin/stdout that checks the forwarder never
sends more than the window it was granted. Needs root (to run as other uids).
Usage: python3 forwarder_test.py [-v]"""

import faulthandler
import hashlib
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

SOURCE = os.path.join(os.path.dirname(__file__), "..", "..", "src", "egress", "forwarder.py")
with open(SOURCE) as f:
    CODE = "\n".join(
        l for l in f.read().splitlines() if not l.strip().startswith("#") and l.strip()
    )
FORWARDER_UID = 65533
OTHER_UID = 12345
HEADER = struct.Struct(">BBHII")
DATA, WINDOW_UPDATE, PING, GO_AWAY = range(4)
SYN, ACK, FIN, RST = 1, 2, 4, 8
WINDOW = 256 * 1024
TIMEOUT = 5


def argv(*args):
    return ["python3", "-I", "-S", "-c", CODE, *args]


def as_user(uid):
    return dict(user=uid, group=uid, extra_groups=[])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HStream:
    def __init__(self, sid, send_window):
        self.id = sid
        self.buf = bytearray()
        self.received = 0
        self.fin = self.rst = self.acked = False
        self.send_window = send_window  # what we (the host) may still send
        self.recv_window = WINDOW  # what the forwarder may still send us


class Host:
    """The host's end of one channel: a yamux server (enough for these tests)."""

    def __init__(self, sock, uid=FORWARDER_UID):
        self.proc = subprocess.Popen(
            argv("channel", sock), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, bufsize=0, **as_user(uid))
        self.cond = threading.Condition()
        self.wlock = threading.Lock()
        self.streams, self.incoming, self.pongs, self.frames = {}, [], [], []
        self.violations, self.last_remote = [], -1
        self.eof = False
        self.auto_grant = True
        self.thread = threading.Thread(target=self.read_loop, daemon=True)
        self.thread.start()

    def write(self, kind, flags, sid, length, payload=b""):
        data = memoryview(HEADER.pack(0, kind, flags, sid, length) + payload)
        with self.wlock:
            while data:
                data = data[self.proc.stdin.write(data):]

    def read_exact(self, n):
        out = bytearray()
        while len(out) < n:
            chunk = self.proc.stdout.read(n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    def read_loop(self):
        try:
            while True:
                version, kind, flags, sid, length = HEADER.unpack(self.read_exact(12))
                payload = self.read_exact(length) if kind == DATA else b""
                self.on_frame(version, kind, flags, sid, length, payload)
        except (EOFError, OSError, ValueError):
            pass
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def on_frame(self, version, kind, flags, sid, length, payload):
        ack = False
        with self.cond:
            self.frames.append((kind, flags, sid, length))
            if version != 0 or kind > GO_AWAY:
                self.violations.append(f"bad header {version} {kind}")
            if kind == PING:
                if flags & ACK:
                    self.pongs.append((sid, length))
                else:
                    self.violations.append("the forwarder pinged")
            elif kind == GO_AWAY:
                self.violations.append(f"go away {length}")
            else:
                if flags & SYN:
                    if kind != WINDOW_UPDATE or length != 0 or sid % 2 != 1 or sid <= self.last_remote:
                        self.violations.append(f"bad SYN {kind} {sid} {length}")
                    self.last_remote = sid
                    self.streams[sid] = HStream(sid, WINDOW)
                    self.incoming.append(sid)
                    ack = True
                s = self.streams.get(sid)
                if s is None:
                    self.violations.append(f"frame for unknown stream {sid}")
                elif flags & RST:
                    s.rst = True
                elif kind == WINDOW_UPDATE:
                    s.send_window += length
                    s.acked |= bool(flags & ACK)
                else:
                    s.acked |= bool(flags & ACK)
                    if s.fin:
                        self.violations.append(f"data after FIN on {sid}")
                    s.recv_window -= len(payload)
                    if s.recv_window < 0:
                        self.violations.append(f"window overrun on {sid}: {s.recv_window}")
                    s.buf += payload
                    s.received += len(payload)
                if s is not None and flags & FIN:
                    s.fin = True
            self.cond.notify_all()
        if ack:
            self.write(WINDOW_UPDATE, ACK, sid, 0)

    def wait(self, predicate, what, timeout=TIMEOUT):
        with self.cond:
            if not self.cond.wait_for(predicate, timeout):
                raise AssertionError(f"timed out waiting for {what}")

    def ready(self):
        """A ping round trip: the forwarder has taken this channel's session."""
        self.ping(0x5EED)

    def ping(self, value):
        self.write(PING, SYN, 0, value)
        self.wait(lambda: (0, value) in self.pongs, f"pong {value}")
        self.pongs.remove((0, value))

    def accept(self, timeout=TIMEOUT):
        self.wait(lambda: self.incoming, "a new stream", timeout)
        with self.cond:
            return self.incoming.pop(0)

    def read(self, sid, n=None, timeout=TIMEOUT):
        """n bytes (or all until FIN), giving the window back as it takes them."""
        s = self.streams[sid]
        self.wait(lambda: s.rst or s.fin or (n is not None and len(s.buf) >= n),
                  f"{n} bytes on {sid}", timeout)
        with self.cond:
            n = len(s.buf) if n is None else min(n, len(s.buf))
            out = bytes(s.buf[:n])
            del s.buf[:n]
            if n:
                s.recv_window += n
        if n:
            self.write(WINDOW_UPDATE, 0, sid, n)
        return out

    def send(self, sid, data, flags=0, timeout=TIMEOUT):
        s = self.streams[sid]
        view = memoryview(data)
        while view:
            self.wait(lambda: s.send_window > 0 or s.rst, f"window on {sid}", timeout)
            with self.cond:
                if s.rst:
                    raise ConnectionResetError(sid)
                n = min(len(view), s.send_window, 16 * 1024)
                s.send_window -= n
                self.cond.notify_all()
            self.write(DATA, flags, sid, n, bytes(view[:n]))
            flags, view = 0, view[n:]

    def fin(self, sid):
        self.write(WINDOW_UPDATE, FIN, sid, 0)

    def rst(self, sid):
        self.write(DATA, RST, sid, 0)

    def open(self, sid, payload, fin_with_data=False):
        """Opens our stream `sid` the way the yamux crate does: SYN on its first data frame."""
        with self.cond:
            self.streams[sid] = HStream(sid, WINDOW)
        flags = SYN | (FIN if fin_with_data else 0)
        self.write(DATA, flags, sid, len(payload), payload)
        if not fin_with_data:
            self.fin(sid)
        return self.streams[sid]

    def claim(self, sid, fin_with_data=False):
        s = self.open(sid, b"claim\n", fin_with_data)
        self.wait(lambda: s.fin or s.rst, f"the answer to claim {sid}")
        return s

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def close(self):
        if self.proc.poll() is None:
            self.kill()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()


def closed_at_once(conn, timeout=1.0):
    """The tool's view of a refused proxy: EOF (or a reset) without a byte."""
    conn.settimeout(timeout)
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


class ForwarderTest(unittest.TestCase):
    def setUp(self):
        self.sock = f"@warden-forwarder-test-{os.getpid()}-{time.monotonic_ns()}"
        self.port = free_port()
        self.stderr = tempfile.TemporaryFile("w+")
        self.addCleanup(self.stderr.close)
        self.serve = subprocess.Popen(argv("serve", str(self.port), self.sock),
                                      stderr=self.stderr, **as_user(FORWARDER_UID))
        self.hosts, self.conns = [], []
        self.addCleanup(self.stop)
        # A hang fails the run, with every thread's stack, and leaves no process behind.
        self.watchdog = threading.Timer(120, self.hung)
        self.watchdog.daemon = True
        self.watchdog.start()
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                self.assertIsNone(self.serve.poll(), "serve exited")
                self.assertLess(time.monotonic(), deadline, "serve never listened")
                time.sleep(0.02)

    def hung(self):
        print(f"{self.id()} hung", file=sys.stderr)
        faulthandler.dump_traceback(all_threads=True)
        self.stop()
        os._exit(1)

    def stop(self):
        self.watchdog.cancel()
        for c in self.conns:
            c.close()
        for h in self.hosts:
            h.close()
        if self.serve.poll() is None:
            self.serve.kill()
        self.serve.wait()

    def tearDown(self):
        for h in self.hosts:
            self.assertEqual(h.violations, [], "protocol violations")
        self.assertIsNone(self.serve.poll(), "serve died")
        self.stderr.seek(0)
        self.assertEqual(self.stderr.read(), "", "serve's stderr")

    def host(self, uid=FORWARDER_UID):
        h = Host(self.sock, uid)
        self.hosts.append(h)
        h.ready()
        return h

    def connect(self):
        c = socket.create_connection(("127.0.0.1", self.port), TIMEOUT)
        self.conns.append(c)
        return c

    def recv_exact(self, c, n):
        out = bytearray()
        while len(out) < n:
            chunk = c.recv(n - len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def test_relay_and_half_close_both_ways(self):
        h = self.host()
        c = self.connect()
        c.sendall(b"hello")
        sid = h.accept()
        self.assertEqual(sid, 1)
        self.assertEqual([f for f in h.frames if f[2] == 1][0], (WINDOW_UPDATE, SYN, 1, 0))
        self.assertEqual(h.read(sid, 5), b"hello")
        h.send(sid, b"world")
        self.assertEqual(self.recv_exact(c, 5), b"world")
        c.shutdown(socket.SHUT_WR)  # the tool's EOF: our FIN
        self.assertEqual(h.read(sid), b"")
        self.assertTrue(h.streams[sid].fin)
        h.send(sid, b"bye")  # the other way still open
        h.fin(sid)
        self.assertEqual(self.recv_exact(c, 4), b"bye")
        self.assertFalse(h.streams[sid].rst)

        c2 = self.connect()
        sid2 = h.accept()
        self.assertEqual(sid2, 3)
        h.send(sid2, b"early")
        h.fin(sid2)  # the host's FIN first: the tool reads EOF ...
        self.assertEqual(self.recv_exact(c2, 6), b"early")
        c2.sendall(b"late")  # ... and still writes
        self.assertEqual(h.read(sid2, 4), b"late")
        c2.shutdown(socket.SHUT_WR)
        self.assertEqual(h.read(sid2), b"")
        self.assertTrue(h.streams[sid2].fin)
        self.assertFalse(h.streams[sid2].rst)
        self.assertEqual(self.recv_exact(c2, 1), b"")

    def test_five_mib_each_way_within_the_windows(self):
        h = self.host()
        c = self.connect()
        up, down = os.urandom(5 << 20), os.urandom(5 << 20)
        got = {}

        def tool():
            w = threading.Thread(target=c.sendall, args=(up,))
            w.start()
            got["down"] = self.recv_exact(c, len(down))
            w.join()
            c.shutdown(socket.SHUT_WR)

        t = threading.Thread(target=tool)
        t.start()
        sid = h.accept()
        # Nothing taken yet: the forwarder stops at the initial window exactly.
        h.wait(lambda: h.streams[sid].received >= WINDOW, "the first window")
        time.sleep(0.5)
        self.assertEqual(h.streams[sid].received, WINDOW)
        self.assertEqual(h.streams[sid].recv_window, 0)
        sender = threading.Thread(target=h.send, args=(sid, down))
        sender.start()
        received = bytearray()
        while not h.streams[sid].fin or h.streams[sid].buf:
            received += h.read(sid, 100_000)
        sender.join()
        h.fin(sid)
        t.join()
        self.assertEqual(hashlib.sha256(received).digest(), hashlib.sha256(up).digest())
        self.assertEqual(hashlib.sha256(got["down"]).digest(), hashlib.sha256(down).digest())
        self.assertFalse(h.streams[sid].rst)

    def test_a_tool_that_stops_reading_stops_the_host_not_other_streams(self):
        h = self.host()
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", self.port))
        self.conns.append(slow)
        sid = h.accept()
        big = b"x" * (16 << 20)
        sender = threading.Thread(target=lambda: h.send(sid, big, timeout=60), daemon=True)
        sender.start()
        s = h.streams[sid]
        h.wait(lambda: s.send_window == 0, "the host out of window")
        time.sleep(1.0)
        self.assertEqual(s.send_window, 0, "the forwarder gave no window back")
        # Another stream still flows.
        c = self.connect()
        c.sendall(b"ping?")
        other = h.accept()
        self.assertEqual(h.read(other, 5), b"ping?")
        h.send(other, b"pong!")
        self.assertEqual(self.recv_exact(c, 5), b"pong!")
        # The slow tool reads: everything arrives.
        got = self.recv_exact(slow, len(big))
        sender.join(TIMEOUT)
        self.assertEqual(len(got), len(big))

    def test_claims_route_connections_and_dead_channels_drop_out(self):
        a = self.host()
        b = self.host()
        self.connect()  # goes to b, the last connected
        sid = b.accept()
        self.assertEqual(a.incoming, [])
        b.rst(sid)

        claim = a.claim(2)  # SYN on data, then FIN on its own
        self.assertEqual(bytes(claim.buf), b"ok\n")
        self.assertTrue(claim.fin and not claim.rst)
        self.assertTrue(claim.acked)
        self.connect()
        a.accept()
        self.assertEqual(b.incoming, [])

        claim = b.claim(2, fin_with_data=True)
        self.assertEqual(bytes(claim.buf), b"ok\n")
        kept = self.connect()
        kept.sendall(b"on b")
        sid = b.accept()
        self.assertEqual(b.read(sid, 4), b"on b")
        self.assertEqual(a.incoming, [])

        bad = a.open(4, b"nope\n", fin_with_data=True)
        a.wait(lambda: bad.rst, "RST of a bad claim")
        self.assertEqual(bytes(bad.buf), b"")
        long = a.open(6, b"claim\n" * 11 + b"!")  # 67 bytes
        a.wait(lambda: long.rst, "RST of an oversize claim")
        a.write(DATA, 0, 6, 4, b"late")  # for a stream reset: ignored
        a.ready()
        self.connect()
        b.accept()  # b is still the one that claimed last

        b.kill()  # its streams' connections close; a (which claimed) takes new ones
        self.assertTrue(closed_at_once(kept, TIMEOUT))
        time.sleep(0.2)
        self.connect()
        a.accept()

        a.proc.stdin.close()  # the host went away: the channel exits at once
        self.assertEqual(a.proc.wait(TIMEOUT), 0)
        time.sleep(0.2)
        self.assertTrue(closed_at_once(self.connect()))

        c = self.host()  # a new host: no live session claimed, the last connected
        self.connect()
        self.assertEqual(c.accept(), 1)

    def test_ping_is_answered(self):
        h = self.host()
        for value in (0, 1, 0xDEADBEEF, 0xFFFFFFFF):
            h.ping(value)

    def test_no_channel_closes_connections_at_once(self):
        self.assertTrue(closed_at_once(self.connect()))

    def test_resets_close_both_ends(self):
        h = self.host()
        c = self.connect()
        sid = h.accept()
        h.rst(sid)
        self.assertTrue(closed_at_once(c, TIMEOUT))
        h.send(sid, b"after the reset")  # ignored, the session lives on
        h.write(WINDOW_UPDATE, 0, sid, 1000)
        h.ready()
        c = self.connect()
        sid = h.accept()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()  # a reset from the tool
        h.wait(lambda: h.streams[sid].rst, "RST from the forwarder")

    def test_go_away_and_protocol_errors_end_the_session(self):
        a, b = self.host(), self.host()
        c = self.connect()
        b.accept()
        b.write(GO_AWAY, 0, 0, 0)
        self.assertTrue(closed_at_once(c, TIMEOUT))
        self.assertEqual(b.proc.wait(TIMEOUT), 0)  # the forwarder hung up: the channel exits
        self.connect()
        a.accept()
        a.write(PING, SYN, 0, 1)
        a.proc.stdin.write(b"\x01" + bytes(11))  # version 1
        a.wait(lambda: a.eof, "the session's end")
        self.assertEqual(a.violations, ["go away 1"])  # a protocol error
        a.violations.clear()
        self.assertEqual(a.pongs, [(0, 1)])
        self.assertTrue(closed_at_once(self.connect()))

    def test_at_most_64_streams_per_session(self):
        h = self.host()
        conns = [self.connect() for _ in range(64)]
        sids = [h.accept() for _ in conns]
        self.assertEqual(sids, list(range(1, 129, 2)))
        self.assertTrue(closed_at_once(self.connect()))
        self.assertEqual(h.incoming, [])
        h.rst(sids[0])
        self.assertTrue(closed_at_once(conns[0], TIMEOUT))
        time.sleep(0.1)
        self.connect()
        self.assertEqual(h.accept(), 129)

    def test_other_uids_are_refused_both_ways(self):
        # A connection to SOCK from another uid: closed, not a frame sent.
        probe = (
            "import socket,sys,struct\n"
            "s=socket.socket(socket.AF_UNIX)\n"
            f"s.connect('\\0'+{self.sock[1:]!r})\n"
            "s.settimeout(5)\n"
            "try:\n"
            "  s.sendall(struct.pack('>BBHII',0,2,1,0,7))\n"
            "  print(repr(s.recv(100)))\n"
            "except (ConnectionResetError, BrokenPipeError):\n"
            "  print('reset')\n")
        out = subprocess.run(["python3", "-c", probe], capture_output=True, text=True,
                             timeout=TIMEOUT, **as_user(OTHER_UID))
        self.assertIn(out.stdout.strip(), ("b''", "reset"), out.stderr)
        # `channel` as another uid than serve's: exit 2, nothing written.
        out = subprocess.run(argv("channel", self.sock), capture_output=True,
                             timeout=TIMEOUT, **as_user(OTHER_UID))
        self.assertEqual((out.returncode, out.stdout), (2, b""))
        # A SOCK squatted by another uid: the channel refuses it.
        squat = f"@warden-forwarder-squat-{os.getpid()}"
        with socket.socket(socket.AF_UNIX) as s:
            s.bind("\0" + squat[1:])
            s.listen()
            out = subprocess.run(argv("channel", squat), input=b"x" * 100, capture_output=True,
                                 timeout=TIMEOUT, **as_user(FORWARDER_UID))
            self.assertEqual((out.returncode, out.stdout), (2, b""))
            # ... and serve cannot take it: exit 4, one line.
            out = subprocess.run(argv("serve", str(free_port()), squat), capture_output=True,
                                 text=True, timeout=TIMEOUT, **as_user(FORWARDER_UID))
            self.assertEqual(out.returncode, 4)
            self.assertEqual(len(out.stderr.strip().splitlines()), 1, out.stderr)
        # No forwarder at all: exit 3.
        out = subprocess.run(argv("channel", squat + "-none"), capture_output=True,
                             timeout=TIMEOUT, **as_user(FORWARDER_UID))
        self.assertEqual((out.returncode, out.stdout), (3, b""))
        # The session still works for its own uid.
        h = self.host()
        self.connect()
        self.assertEqual(h.accept(), 1)


if __name__ == "__main__":
    if os.getuid() != 0:
        sys.exit("forwarder_test.py runs as root (it runs the forwarder as uid 65533)")
    unittest.main()
