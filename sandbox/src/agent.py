# warden's in-container agent. Started by the host as root on a long-lived `docker exec`
# (`python3 -I -S -c <this file> serve <uid> <gid>`), it drops to the sandbox user at once
# (which also makes it non-dumpable: the commands it runs, as the same user, cannot open
# its /proc entries, file descriptors or memory), then serves one request at a time over
# stdin/stdout with length-prefixed frames, so tool arguments never share a channel with
# control data. Also run once-off, started as root and dropping to the sandbox user like
# `serve` (after `<uid> <gid>`): `sweep-all` (adopting a container after a host crash),
# `sweep-lives <replica> <life>` (a replica adopting its own container: only the agents of
# its earlier lives and their trees), `kill-agent <pid> <starttime>` (a call overran its
# deadline or was dropped); as the sandbox user: `exec-owned <argv...>` (say pid and start
# time on stdout, then become argv: a session process the host ends on purpose); and as root:
# `prepare <forwarder port or 0>` (once, before any sandboxed code runs; `prepare-serve
# <port> <uid> <gid> [<replica> <life>]` prepares and then serves as the first agent, in one
# exec), `use-hold
# <seconds>` (may an idle session be removed: no call running, and the use mark
# untouched for that long; if so, no call starts until the host is done removing it) and
# `settle <uid> <gid> <tag>` (record a session process's steady state, below).
#
# Session processes (stdio MCP servers, sandbox/src/process.rs) are exec roots of their
# own, so the sweeps leave their trees alone; a program such a server starts while it
# serves a tool call (git running a hook the model wrote) is its descendant, not an orphan,
# and would run beside later commands, able to read their environment. So the host
# *settles* each session process once it is in its steady state (after the MCP handshake
# and first tool listing): `settle` finds the exec root whose environment carries the
# host's tag (WARDEN_SESSION_PROCESS) and records it with every descendant it has then
# (wrappers such as `uvx` or `npx` legitimately keep their server as a child) — each as
# (pid, starttime), so a reused pid is never taken for a recorded process — in SETTLED, a
# directory of root's (mode 0755: the sandbox user reads it, never writes it; the host's
# workspace setup makes it before any sandboxed code runs, and a directory that is not
# root's is not believed), one file per session process, written once and never widened.
# Before every command starts, and when the host asks after each call of a session process
# (`contain`), the agent kills every descendant of a settled session process that is not in
# its record (then the orphans). So nothing a tool call left behind outlives that call or
# runs beside a later command, while the server itself and its recorded helpers run on.
# A child a server starts during a call that is still running when a command starts is
# killed too (that call fails): the server is trusted, what it runs for a call is not.
#
# Use mark: USE_MARK, created empty by the host's workspace setup (root, mode 0600, so no
# sandboxed process can open, touch or lock it). A serving agent opens it before it drops
# to the sandbox user and, around every request, holds a shared lock on it and writes it
# (its mtime is the session's last use by any replica). Agents started by a replica carry
# `<replica> <life>` after `serve <uid> <gid>` (or `prepare-serve <port> <uid> <gid>`),
# visible in their command line only.
#
# Wire format (all integers u32 big-endian):
#   request  = len, fields...      with field = len, bytes;  fields: op, nonce, op's own
#   response = frames...           with frame = kind (1 byte), len, payload
#     kinds: b"h" hello (once, at start: pid, starttime), b"o" command stdout, b"e" command
#     stderr, b"d" file data, b"s" the Bash shell's physical working directory (read by the
#     agent from /proc, never written by the command), b"r" the result (fields: key, value, ...; always echoes the request's nonce).
#     `r` is always the last frame of a response.
#
# Rules this file must keep (see sandbox/src/agent.rs for the host side):
# - Only the Python standard library of `python3-minimal` (no json, no ctypes).
# - Reject NUL in every string that reaches a path, argv or environment (the host already
#   refused them; this is the second line).
# - File operations never follow a symbolic link: every component is opened with
#   O_NOFOLLOW beneath /workspace, so a link planted after the host's check fails the call.
#   Directories are opened by open_dir_nofollow only: without O_DIRECTORY, then checked
#   with fstat (gVisor follows a final link for O_DIRECTORY | O_NOFOLLOW).
# - After every command: kill its process group, then every process of this user that is
#   not the container's init, its main process, an exec root (another agent, housekeeping)
#   or inside another exec root's tree. Nothing a call starts outlives it. Every sweep
#   stops all of this user's processes at once before it reads /proc (kill_in_rounds),
#   one sweep at a time per container (the sweep turn, SWEEP_LOCK): every process that
#   sweeps starts as root and opens the lock before it drops to the sandbox user.
# - Before every command: the same sweep of orphans, after killing every descendant of a
#   settled session process that is not in its record (SETTLED, above). The host asks for
#   the same after every call of a session process (`contain`), so nothing such a call
#   starts outlives it either; before every file operation, the sweep of orphans.
# - No named files: captures are anonymous (O_TMPFILE) and the session's working directory
#   travels in the protocol (read from /proc by the agent; the host checks it again), so
#   nothing a command writes under /tmp can redirect, read or wedge the agent.
# - A command inherits descriptors 0-2 only (a search's pinned root as well for an exec),
#   and the agent's settings as they were when it started: an agent whose limits,
#   niceness or CPU affinity a command changed exits before its next request.
# - A zombie thread-group leader whose other threads run is alive (proc_table): no state in
#   /proc hides a process from the sweeps.
import errno
import fcntl
import os
import select
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time

WS = "/workspace"
# The use mark (sandbox/src/agent.rs: USE_MARK).
USE_MARK = "/tmp/.warden-used"
# Records of settled session processes (sandbox/src/agent.rs: SETTLED_DIR).
SETTLED = "/tmp/.warden-settled"
# The variable whose value names a session process (sandbox/src/process.rs: PROCESS_TAG_VAR).
TAG_VAR = b"WARDEN_SESSION_PROCESS"
# Largest record read: a session process with this many bytes of descendants is not believed.
MAX_RECORD_BYTES = 1024 * 1024
# Most of a process's environment `settle` reads looking for TAG_VAR (the host puts it
# last): a bigger environment hides the tag, so the process is not settled and not used.
MAX_ENVIRON_BYTES = 1024 * 1024
# Most parent links followed from one process: /proc is read while processes come and go,
# so a walk must end even if the table it has holds a cycle of reused pids.
MAX_ANCESTRY = 4096
# What a serving agent exits with, unanswered, when its settings are not the container's
# init's (settings_of), and when the init's limits are not the recorded ones
# (container_poisoned) (sandbox/src/exec.rs: AGENT_RETIRED, CONTAINER_POISONED).
AGENT_RETIRED = 9
CONTAINER_POISONED = 10
# `prepare`'s exit status when a path it makes exists and is not root's.
PREPARE_UNTRUSTED = 6
# The resource limits every process of the container starts with, recorded by `prepare`
# before any sandboxed code runs: root's, mode 0644 (sandbox/src/agent.rs:
# SETTINGS_RECORD).
SETTINGS_RECORD = "/tmp/.warden-settings"
# This serving agent's copy of the record (None: a container made before it existed).
RECORD = [None]
# The tools' configuration directory with its empty .curlrc (sandbox/src/environment.rs:
# TOOL_CONFIG_DIR).
TOOL_CONFIG_DIR = "/tmp/.warden-config"
# `prepare`'s exit status when the egress forwarder does not listen (sandbox/src/egress:
# FORWARDER_NOT_READY).
FORWARDER_NOT_READY = 3
# `settle` exit codes (sandbox/src/exec.rs: settle).
SETTLE_NOT_FOUND = 3
SETTLE_UNTRUSTED = 5
MAX_FIELD = 512 * 1024 * 1024
MAX_FIELDS = 100000
CHUNK = 64 * 1024
MAX_SYMLINK_HOPS = 40
SWEEP_ROUNDS = 200
# One sweep round at a time per container (kill_in_rounds): root's file, mode 0600, made by
# the host's workspace setup (sandbox/src/agent.rs: SWEEP_LOCK); every agent opens it as
# root before it drops to the sandbox user, so no sandboxed process can lock or write it.
SWEEP_LOCK = "/tmp/.warden-sweep"
# This process's descriptor of SWEEP_LOCK (None: it takes no turns).
SWEEP_FD = [None]
# Seconds between two looks at the sweep turn while another sweep holds it (a round is one
# read of /proc), and between two rounds of one sweep (so a waiter gets its turn).
SWEEP_TURN_POLL = 0.005
# Seconds a sweep waits for its turn before it continues the stopped exec roots (a holder a
# command stopped): far longer than a round, which is one read of /proc.
SWEEP_TURN_PATIENCE = 0.5
# Process states of a task that has ended (zombie, dead): nothing of it runs.
DEAD_STATES = (b"Z", b"X", b"x")
# The state proc_table gives a zombie leader whose other threads still run.
LIVE = b"R"
# What status_threads says when it cannot read the count: more than the leader alone.
THREADS_UNKNOWN = 2
# Requests that only touch files: before each the agent kills the orphans (not what settled
# session processes run: one of their calls may be running now, and a file op has no
# environment to steal; `contain` and every command start take care of those).
FILE_OPS = ("stat", "read", "write")
# Free bytes below which a failed command is told that the workspace is full.
FULL_BELOW = 64 * 1024
# Runs the user's command ($1); on its way out the shell stops itself, so the agent (its
# parent, which waits for stops too) reads the shell's working directory from
# /proc/<pid>/cwd, then sends SIGURG and lets it go on: on SIGURG the stopped shell
# exits with the command's status (before its exit trap SIGURG does nothing to the shell,
# unless the command trapped it itself).
# Every sweep continues every stopped process of this user, so a sweep beside the command
# could let the shell go before its agent saw the stop: the shell then stops again, up to
# EXIT_STOPS times, until its agent has read it. The command inherits fds 0-2 only: the
# session's state travels on no channel a command can write, and a command that skips the
# stop (`exec`, a kill of its own shell, a function named `kill`) only leaves the working
# directory as it was, or as the shell's real one at its last stop. (100 stops ran out once
# under gVisor with four reading calls sweeping beside a `cd`: a stop the agent reads ends
# the loop at once, so the bound only matters while sweeps keep letting the shell go.)
EXIT_STOPS = 1000
RUNNER = ("trap '__w_rc=$?; trap \"exit \\$__w_rc\" URG; "
          "for ((__w_i = 0; __w_i < %d; __w_i++)); do kill -STOP $$; done; exit $__w_rc' EXIT\n"
          "eval \"$1\"" % EXIT_STOPS)
# Hard-linked files a refused search names (it stops looking after one more).
MAX_LINKED_SHOWN = 5
# Longest working directory reported (the host refuses longer ones anyway).
MAX_CWD_BYTES = 4096


class Refused(Exception):
    pass


# Commands this agent has started; every result reports it, so the host can prove that one
# request started at most one command.
STARTED = [0]
# The current request's nonce, echoed in its result so the host can tell it from any other.
NONCE = [b""]


def read_exact(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sys.stdin.buffer.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_request():
    head = read_exact(4)
    if head is None:
        return None
    (total,) = struct.unpack(">I", head)
    if total > MAX_FIELD + 1024 * 1024:
        raise SystemExit(3)
    body = read_exact(total)
    if body is None:
        return None
    fields, at = [], 0
    while at < len(body):
        if at + 4 > len(body) or len(fields) >= MAX_FIELDS:
            raise SystemExit(3)
        (n,) = struct.unpack(">I", body[at:at + 4])
        at += 4
        if at + n > len(body):
            raise SystemExit(3)
        fields.append(body[at:at + n])
        at += n
    return fields


OUT = sys.stdout.buffer


def frame(kind, payload):
    OUT.write(kind + struct.pack(">I", len(payload)))
    OUT.write(payload)


def fields_bytes(items):
    out = bytearray()
    for x in items:
        b = x if isinstance(x, bytes) else str(x).encode()
        out += struct.pack(">I", len(b)) + b
    return bytes(out)


def result(**kv):
    kv["started"] = STARTED[0]
    kv["nonce"] = NONCE[0]
    items = []
    for k, v in kv.items():
        items += [k, v]
    frame(b"r", fields_bytes(items))
    OUT.flush()


def text(b):
    if b"\0" in b:
        raise Refused("NUL byte in an argument")
    return os.fsdecode(b)


# ---------------------------------------------------------------- processes

def proc_table():
    """pid -> (ppid, uid, starttime, state) for every process visible in /proc. The state
    is the process's, except that a zombie thread-group leader with a thread still running
    reads LIVE: its threads run on (a raw `exit` of the leader while another thread runs),
    so it is as alive as any process and must be swept like one."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                raw = f.read()
            uid = os.stat("/proc/%d" % pid).st_uid
        except OSError:
            continue
        rest = raw[raw.rfind(b")") + 2:].split()
        try:
            state = rest[0]
            if state in DEAD_STATES and threads_alive(pid):
                state = LIVE
            table[pid] = (int(rest[1]), uid, int(rest[19]), state)
        except (IndexError, ValueError):
            continue
    return table


def threads_alive(pid):
    """Whether a thread of process `pid` other than its leader is in a state other than
    dead or zombie (an unreadable thread list counts as alive: kill rather than spare).
    gVisor lists no task directory for a zombie leader, even while its other threads run:
    there the count in its status decides (Threads: counts the leader too)."""
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except FileNotFoundError:
        return status_threads(pid) > 1
    except OSError:
        return True
    for tid in tids:
        if tid == str(pid):
            continue
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            continue
        except OSError:
            return True
        tstate = raw[raw.rfind(b")") + 2:].split()[:1]
        if not tstate or tstate[0] not in DEAD_STATES:
            return True
    return False


def root_of(pid, table):
    """The exec root (a process whose parent is outside the container, ppid 0) or 1."""
    seen = 0
    while pid in table and seen < MAX_ANCESTRY:
        ppid = table[pid][0]
        if ppid == 0:
            return pid
        if ppid == 1:
            return 1
        pid, seen = ppid, seen + 1
    return 1


def status_threads(pid):
    """The `Threads:` count of /proc/<pid>/status; 0 when the process is gone, and
    THREADS_UNKNOWN (more than one: kill rather than spare) when the line cannot be read."""
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"Threads:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, IndexError):
        pass
    return THREADS_UNKNOWN


def kill_in_rounds(victims_of):
    """Kills the processes `victims_of(table)` names, round after round until a round names
    none or SWEEP_ROUNDS pass; returns how many were killed. Each round first stops every
    process of this user at once (`kill(-1, SIGSTOP)`: the kernel signals them all under
    one lock, so no fork escapes it), then reads /proc with nothing of this user moving,
    kills the victims and lets the others go on (`kill(-1, SIGCONT)`). A listing of a
    running /proc is not proof: a chain of processes that fork and exit faster than it is
    read is never seen alive in it (the hopper of issue 40's review). A round is the
    container's only one while it runs (`sweep_turn`): two sweeps that stopped each other
    would stay stopped, and with them every process of the session."""
    killed = 0
    for _ in range(SWEEP_ROUNDS):
        with sweep_turn():
            freeze_user(signal.SIGSTOP)
            try:
                victims = victims_of(proc_table())
                for pid in victims:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed += 1
                    except OSError:
                        pass
            finally:
                freeze_user(signal.SIGCONT)
        reap()
        if not victims:
            break
        time.sleep(SWEEP_TURN_POLL)  # the others' turn first
    return killed


def open_sweep_lock():
    """Root, before dropping to the sandbox user: opens (or makes) SWEEP_LOCK for this
    process's sweeps, if it is root's regular file (one a sandboxed process made is not
    believed: its sweeps then take no turns, as before the lock existed)."""
    try:
        fd = os.open(SWEEP_LOCK, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError:
        return
    st = os.fstat(fd)
    if st.st_uid != 0 or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return
    SWEEP_FD[0] = fd


class sweep_turn:
    """The container's sweep turn (an exclusive lock on SWEEP_LOCK) for one round. Only a
    command's `kill -STOP` can stop the holder (every other sweep waits its turn), so a
    sweep that has waited SWEEP_TURN_PATIENCE continues every stopped exec root of this
    user (the holder is one: agents and once-off sweeps are exec roots) and keeps doing so
    while it waits: a stopped holder wedges no one. What a holder's freeze stopped besides
    exec roots (commands, orphans) stays stopped until the holder lets it go."""

    def __enter__(self):
        fd = SWEEP_FD[0]
        if fd is None:
            return self
        since = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                pass
            if time.monotonic() - since >= SWEEP_TURN_PATIENCE:
                continue_stopped_exec_roots()
                since = time.monotonic()
            time.sleep(SWEEP_TURN_POLL)

    def __exit__(self, *_):
        if SWEEP_FD[0] is not None:
            fcntl.flock(SWEEP_FD[0], fcntl.LOCK_UN)
        return False


def continue_stopped_exec_roots():
    """Continues every stopped exec root of this user but this process."""
    me, uid = os.getpid(), os.getuid()
    for pid, (ppid, puid, _, state) in proc_table().items():
        if ppid == 0 and puid == uid and pid != me and state == b"T":
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass


def freeze_user(sig):
    """Sends `sig` to every process of this user in this container but this one (and
    init): SIGSTOP before a sweep reads /proc, SIGCONT after it. Live calls' processes
    (other agents, their commands, settled session processes) pause for the length of one
    /proc read; one stopped on purpose before is continued too."""
    try:
        os.kill(-1, sig)
    except OSError:
        pass  # nothing else of this user runs


def sweep(everything):
    """Kills this user's processes that no other live call owns; returns how many."""
    me, uid = os.getpid(), os.getuid()

    def victims(table):
        return [pid for pid, (ppid, puid, _, state) in table.items()
                if puid == uid and pid not in (1, me) and state not in DEAD_STATES and (everything or ppid != 0)
                and (everything or root_of(pid, table) in (1, me))]
    return kill_in_rounds(victims)


def settled_dir_trusted(st):
    """Whether SETTLED's lstat says it is root's own directory that nobody else may write."""
    return st.st_uid == 0 and stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o022


def parse_record(raw):
    """A record's (pid, starttime) pairs, one per line, the session process first; None
    when it is not one."""
    pairs = []
    for line in raw.split(b"\n"):
        if not line:
            continue
        parts = line.split(b" ")
        if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit():
            return None
        pairs.append((int(parts[0]), int(parts[1])))
    return pairs or None


def settled_records():
    """[(session process (pid, starttime), set of recorded (pid, starttime))] from SETTLED;
    nothing when it is missing or not root's."""
    try:
        if not settled_dir_trusted(os.lstat(SETTLED)):
            return []
        names = os.listdir(SETTLED)
    except OSError:
        return []
    records = []
    for name in names:
        if name.startswith("."):
            continue  # a record being written
        try:
            fd = os.open(SETTLED + "/" + name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            if os.fstat(f.fileno()).st_uid != 0:
                continue
            raw = f.read(MAX_RECORD_BYTES + 1)
        pairs = parse_record(raw) if len(raw) <= MAX_RECORD_BYTES else None
        if pairs is not None:
            records.append((pairs[0], set(pairs)))
    return records


def descends_from(pid, ancestor, table):
    """Whether `ancestor` is among `pid`'s parents in `table`."""
    seen = 0
    while pid in table and seen < MAX_ANCESTRY:
        pid, seen = table[pid][0], seen + 1
        if pid == ancestor:
            return True
    return False


def contain_session_processes():
    """Kills this user's descendants of settled session processes that their records do
    not hold (then their orphans are the sweep's); returns how many."""
    records = settled_records()
    if not records:
        return 0
    uid = os.getuid()

    def victims(table):
        found = []
        for (root, root_start), kept in records:
            if root not in table or table[root][2] != root_start:
                continue  # ended (its pid may be another process's now)
            for pid, (_, puid, start, state) in table.items():
                if puid == uid and state not in DEAD_STATES and (pid, start) not in kept and descends_from(pid, root, table):
                    found.append(pid)
        return found
    return kill_in_rounds(victims)


def tagged_root(tag, table):
    """The exec root of this user whose environment holds TAG_VAR=tag, or None."""
    uid, want = os.getuid(), TAG_VAR + b"=" + tag
    for pid, (ppid, puid, _, state) in table.items():
        if ppid != 0 or puid != uid or state in DEAD_STATES:
            continue
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = f.read(MAX_ENVIRON_BYTES)
        except OSError:
            continue
        if want in env.split(b"\0"):
            return pid
    return None


def settle(uid, gid, tag):
    """Root: records the session process tagged `tag` with its descendants in SETTLED (see
    the top of this file); an earlier record of the same process is kept as it was. The
    process is found by a child that drops to the sandbox user (root here may not read
    that user's /proc/<pid>/environ); records of ended processes are removed."""
    try:
        os.mkdir(SETTLED, 0o755)
    except FileExistsError:
        pass
    dfd = open_dir_nofollow(SETTLED)
    if os.fstat(dfd).st_uid != 0:
        return SETTLE_UNTRUSTED
    os.fchmod(dfd, 0o755)  # whatever the umask: every agent must read it
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.close(r)
            os.close(dfd)
            drop_privileges(uid, gid)
            table = proc_table()
            root = tagged_root(tag, table)
            if root is not None:
                tree = [root] + sorted(p for p in table if table[p][3] not in DEAD_STATES and descends_from(p, root, table))
                os.write(w, b"".join(b"%d %d\n" % (p, table[p][2]) for p in tree))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        raw = f.read(MAX_RECORD_BYTES + 1)
    _, status = os.waitpid(child, 0)
    if status != 0:
        return 1
    pairs = parse_record(raw) if len(raw) <= MAX_RECORD_BYTES else None
    if pairs is None:
        return SETTLE_NOT_FOUND
    table = proc_table()
    for name in os.listdir(dfd):
        # `<pid>-<starttime>`, or `.<pid>-<starttime>` while being written.
        parts = name[1:].split("-") if name.startswith(".") else name.split("-")
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            pid, start = int(parts[0]), int(parts[1])
            if pid in table and table[pid][2] == start:
                continue
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass  # another settle pruned it
    name = "%d-%d" % pairs[0]
    if name in os.listdir(dfd):
        return 0
    tmp = "." + name
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o644)
        f.write(raw)
    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    return 0


def stop_then_kill(pids):
    """SIGSTOP every victim first, so none can fork away between the kills."""
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        n = 0
        for pid in pids:
            try:
                os.kill(pid, sig)
                n += 1
            except OSError:
                pass
    return n


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_group(pgid):
    for _ in range(10000):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            return


def run(argv, env, timeout, grace, out, err, pass_fds=()):
    """Runs argv in its own session with stdout/stderr to the anonymous files out/err and
    no other descriptor but `pass_fds`; returns (code, timed_out, cwd): cwd is the
    physical working directory the process had the last time it stopped (see RUNNER), or
    None when it never stopped inside /workspace."""
    STARTED[0] += 1
    # What a session process (a stdio MCP server) started after it settled, and orphans
    # (reparented to init, belonging to no live call): killed before this command starts,
    # so nothing a tool call left running, nor a call whose sweep did not run, ever runs
    # beside it and reads its environment.
    contain_session_processes()
    sweep(False)
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                             env=env, start_new_session=True, close_fds=True,
                             pass_fds=pass_fds)
    except FileNotFoundError:
        err.write(("%s: command not found\n" % argv[0]).encode())
        return 127, False, None
    except PermissionError:
        err.write(("%s: permission denied\n" % argv[0]).encode())
        return 126, False, None
    timed_out, watch = False, Watch(p.pid)
    try:
        try:
            status = watch.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                status = watch.wait(grace)
            except subprocess.TimeoutExpired:
                kill_group(p.pid)
                status = watch.wait(None)
    finally:
        watch.close()
    # Popen must not wait for (or guess at) a child the watch has reaped.
    p.returncode = os.waitstatus_to_exitcode(status)
    kill_group(p.pid)
    sweep(False)
    code = p.returncode
    if code < 0:
        code = 128 - code
    if timed_out and code not in (124, 137):
        code = 124
    return code, timed_out, watch.cwd


class Watch:
    """Waits for one child to exit, waking at once on its exit and on each of its stops
    (SIGCHLD through a wakeup pipe: no polling); at a stop it reads the child's working
    directory and lets it continue."""

    def __init__(self, pid):
        self.pid, self.cwd = pid, None
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.old_fd = signal.set_wakeup_fd(self.w)
        self.old_handler = signal.signal(signal.SIGCHLD, lambda *_: None)

    def close(self):
        signal.signal(signal.SIGCHLD, self.old_handler)
        signal.set_wakeup_fd(self.old_fd)
        os.close(self.r)
        os.close(self.w)

    def wait(self, timeout):
        """The child's wait status once it exits; TimeoutExpired after `timeout` seconds
        (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG | os.WUNTRACED)
            if pid == self.pid:
                if not os.WIFSTOPPED(status):
                    return status
                self.cwd = cwd_of(self.pid) or self.cwd
                try:
                    os.kill(self.pid, signal.SIGURG)  # read: a stop in the exit trap ends
                    os.kill(self.pid, signal.SIGCONT)
                except OSError:
                    pass
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("command", timeout)
            select.select([self.r], [], [], left)
            try:
                while os.read(self.r, 512):
                    pass
            except BlockingIOError:
                pass


def cwd_of(pid):
    """The physical working directory of process `pid` if it is /workspace or a directory
    beneath it that still exists, else None."""
    try:
        cwd = os.readlink("/proc/%d/cwd" % pid)
    except OSError:
        return None
    return cwd if physical_dir_inside(cwd) else None


def physical_dir_inside(path):
    """Whether `path` names /workspace or an existing directory beneath it with no `.`,
    `..` or symbolic link on the way (its real path is itself)."""
    inside = path == WS or path.startswith(WS + "/")
    if not inside or len(path) > MAX_CWD_BYTES or "\0" in path:
        return False
    try:
        return os.path.realpath(path) == path and os.path.isdir(path)
    except (OSError, ValueError):
        return False


def send_capture(kind, f, cap, rewrite):
    with f:
        total = f.seek(0, 2)
        if total <= cap:
            parts = [(0, total)]
        else:
            head = cap // 2
            parts = [(0, head), (total - (cap - head), cap - head)]
        sent = 0
        for start, n in parts:
            f.seek(start)
            data = f.read(n)
            if rewrite:
                data = data.replace(rewrite[0], rewrite[1])
            sent += len(data)
            for i in range(0, len(data), CHUNK):
                frame(kind, data[i:i + CHUNK])
        if len(parts) == 1:
            total = sent
    return total


# ---------------------------------------------------------------- paths

def split_ws(path):
    if path != WS and not path.startswith(WS + "/"):
        raise Refused("outside")
    return [c for c in path[len(WS):].split("/") if c]


def resolve(path):
    """Resolves symlinks beneath /workspace as the kernel would, refusing to leave it.
    Returns (resolved, lstat-or-None); missing tails are taken lexically."""
    todo = split_ws(path)
    done, hops = [], 0
    while todo:
        c = todo.pop(0)
        if c == ".":
            continue
        if c == "..":
            if not done:
                raise Refused("outside")
            done.pop()
            continue
        cur = WS + "/" + "/".join(done + [c])
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            done.append(c)
            rest = todo
            todo = []
            for r in rest:
                if r == "..":
                    if not done:
                        raise Refused("outside")
                    done.pop()
                elif r != ".":
                    done.append(r)
            return WS + "".join("/" + d for d in done), None
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                raise OSError(errno.ELOOP, "too many levels of symbolic links")
            target = os.readlink(cur)
            if target.startswith("/"):
                if target != WS and not target.startswith(WS + "/"):
                    raise Refused("outside:" + target)
                done = []
                todo = [x for x in target[len(WS):].split("/") if x] + todo
            else:
                todo = [x for x in target.split("/") if x] + todo
            continue
        if todo and not stat.S_ISDIR(st.st_mode):
            raise OSError(errno.ENOTDIR, "not a directory")
        done.append(c)
    full = WS + "".join("/" + d for d in done)
    return full, os.lstat(full)


def open_dir_nofollow(name, dir_fd=None):
    """Opens the directory `name` (relative to dir_fd) without following a link in its last
    component: O_NOFOLLOW alone refuses a link (ELOOP) on every kernel, while with
    O_DIRECTORY gVisor follows it (a link to /tmp opened /tmp), so the kind is checked
    on the descriptor instead. O_NONBLOCK: a FIFO planted under the name never blocks."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.ENOTDIR, "not a directory", name)
    return fd


def open_beneath(path, final_flags, create_dirs=False):
    """Opens path (already resolved) beneath /workspace without following any symlink.
    Returns (dir_fd, name, fd-or-None); name is None for /workspace itself."""
    parts = split_ws(path)
    fd = os.open(WS, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for c in parts[:-1]:
            if c in (".", ".."):
                raise Refused("outside")
            try:
                nfd = open_dir_nofollow(c, fd)
            except FileNotFoundError:
                if not create_dirs:
                    raise
                os.mkdir(c, 0o755, dir_fd=fd)
                nfd = open_dir_nofollow(c, fd)
            os.close(fd)
            fd = nfd
        if not parts:
            return fd, None, None
        name = parts[-1]
        if name in (".", ".."):
            raise Refused("outside")
        if final_flags is None:
            return fd, name, None
        return fd, name, os.open(name, final_flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except BaseException:
        os.close(fd)
        raise


def kind_of(mode):
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    for test, name in ((stat.S_ISLNK, "symbolic link"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return "other:" + name
    return "other:unknown"


def os_message(e):
    if e.errno == errno.ELOOP:
        return "a path component is a symbolic link (created after the check?); refused"
    if e.errno == errno.ENOSPC:
        return "no space left in the session workspace (sandbox.disk)"
    return e.strerror or str(e)


def op_stat(f):
    path, purpose, tree = text(f[1]), text(f[2]), f[3] == b"tree"
    try:
        resolved, st = resolve(path)
    except Refused as r:
        return result(status="outside", resolved=str(r)[len("outside:"):] or path)
    except OSError as e:
        return result(status="error", message=os_message(e))
    if st is None:
        if purpose == "write":
            try:
                dfd, _, _ = open_beneath(resolved, None, create_dirs=True)
                os.close(dfd)
            except Refused:
                return result(status="outside", resolved=resolved)
            except OSError as e:
                return result(status="error", message="cannot create its parent directory: " + os_message(e))
        return result(status="ok", resolved=resolved, kind="missing", size=0, mode=0o644)
    linked = 0
    if tree and stat.S_ISDIR(st.st_mode):
        fd = open_reported(resolved)
        if fd is None:
            return
        try:
            linked = len(linked_files(fd))
        finally:
            os.close(fd)
    return result(status="ok", resolved=resolved, kind=kind_of(st.st_mode), size=st.st_size,
                  mode=stat.S_IMODE(st.st_mode), links=st.st_nlink, dev=st.st_dev, ino=st.st_ino,
                  linked=linked)


def open_reported(path):
    """Opens a resolved path for reading (no link followed, never blocking on a FIFO);
    returns its descriptor, or None after sending the result that says why not."""
    try:
        dfd, _, fd = open_beneath(path, os.O_RDONLY | os.O_NONBLOCK)
    except Refused:
        result(status="outside", message=path)
        return None
    except OSError as e:
        result(status="error", message=os_message(e))
        return None
    if fd is None:
        return dfd
    os.close(dfd)
    return fd


def op_read(f):
    path, limit, expect = text(f[1]), int(f[2]), text(f[3])
    fd = open_reported(path)
    if fd is None:
        return
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            return result(status="error", message="not a regular file")
        # One open per decision: what is read is the file that was judged (the host's
        # `dev:ino` of it), not whatever was renamed or linked over its name since.
        if expect and expect != "%d:%d" % (st.st_dev, st.st_ino):
            return result(status="error", message="the file was replaced after it was checked; refused")
        if st.st_size > limit:
            return result(status="error", message="larger than %d bytes" % limit)
        left = limit
        while left > 0:
            data = fh.read(min(CHUNK, left))
            if not data:
                break
            frame(b"d", data)
            left -= len(data)
        if fh.read(1):
            return result(status="error", message="grew past %d bytes while being read" % limit)
    return result(status="ok", size=st.st_size, mode=stat.S_IMODE(st.st_mode))


def op_write(f):
    path, data = text(f[1]), f[2]
    try:
        dfd, name, _ = open_beneath(path, None, create_dirs=True)
    except Refused:
        return result(status="outside", message=path)
    except OSError as e:
        return result(status="error", message=os_message(e))
    if name is None:
        os.close(dfd)
        return result(status="error", message="is a directory")
    tmp = ".warden-write-%d-%d" % (os.getpid(), time.monotonic_ns())
    try:
        mode, existed = 0o644, False
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                return result(status="error", message="is a directory")
            if stat.S_ISREG(st.st_mode):
                mode, existed = stat.S_IMODE(st.st_mode), True
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view[:CHUNK * 16])
                view = view[n:]
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return result(status="ok", existed=int(existed))
    except OSError as e:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        return result(status="error", message=os_message(e))
    finally:
        os.close(dfd)


def op_exec(f):
    timeout, grace, cap = int(f[1]) / 1000.0, int(f[2]) / 1000.0, int(f[3])
    pin = text(f[4])
    pin_index = int(f[5])
    refuse_linked = f[6] == b"refuse-linked"
    argc = int(f[7])
    argv = [text(x) for x in f[8:8 + argc]]
    at = 8 + argc
    envc = int(f[at])
    env = dict(os.environ)
    for i in range(envc):
        env[text(f[at + 1 + 2 * i])] = text(f[at + 2 + 2 * i])
    if not argv:
        raise Refused("empty argv")
    pass_fds, rewrite, pin_fd = (), None, None
    if pin:
        pin_fd = open_reported(pin)
        if pin_fd is None:
            return
        linked = linked_files(pin_fd) if refuse_linked else []
        if linked:
            os.close(pin_fd)
            shown = ", ".join(pin + "/" + x for x in linked[:MAX_LINKED_SHOWN])
            shown += ", ..." if len(linked) > MAX_LINKED_SHOWN else ""
            return result(status="error", message="%s holds files with other hard links (%s), names no rule was "
                          "checked against; search a directory without them, or Read them one by one" % (pin, shown))
        if pin_index >= 0:
            argv[pin_index] = "/proc/self/fd/%d" % pin_fd
            pass_fds = (pin_fd,)
            rewrite = (argv[pin_index].encode(), pin.encode())
    out, err = tempfile.TemporaryFile(dir="/tmp"), tempfile.TemporaryFile(dir="/tmp")
    try:
        code, timed_out, _ = run(argv, env, timeout, grace, out, err, pass_fds)
    finally:
        if pin_fd is not None:
            os.close(pin_fd)
    out_total = send_capture(b"o", out, cap, rewrite)
    err_total = send_capture(b"e", err, cap, rewrite)
    result(status="ok", code=code, timed_out=int(timed_out), out_total=out_total, err_total=err_total,
           poisoned=int(container_poisoned(RECORD[0])))


def linked_files(dir_fd):
    """Paths (relative) of the regular files beneath the open directory `dir_fd`, `.git`
    directories left out as the searches leave them out, that have more than one hard link;
    a search stops listing after MAX_LINKED_SHOWN + 1. Nothing is followed."""
    if not stat.S_ISDIR(os.fstat(dir_fd).st_mode):
        return []
    found = []
    for top, dirs, files, fd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                found.append(os.path.normpath(os.path.join(top, name)))
                if len(found) > MAX_LINKED_SHOWN:
                    return found
    return found


def op_bash(f):
    timeout, grace, cap = int(f[1]) / 1000.0, int(f[2]) / 1000.0, int(f[3])
    command = text(f[4])
    n = int(f[5])
    # The container's environment (warden's fixed set), then the task's variables, which
    # never replace one of the fixed set (the host refused such names already).
    env = dict(os.environ)
    for i in range(n):
        name, value = text(f[6 + 2 * i]), text(f[7 + 2 * i])
        if name in os.environ:
            raise Refused("the variable %s is warden's own" % name)
        env[name] = value
    cwd = text(f[6 + 2 * n])
    # The directory the command's files were judged from, or nothing runs.
    if not physical_dir_inside(cwd):
        return result(status="error", message="the working directory %s no longer exists" % cwd)
    out, err = tempfile.TemporaryFile(dir="/tmp"), tempfile.TemporaryFile(dir="/tmp")
    try:
        os.chdir(cwd)
    except OSError:
        return result(status="error", message="the working directory %s cannot be entered" % cwd)
    try:
        # No startup file, whatever the environment (Debian's bash reads ~/.bashrc for
        # `bash -c` when SSH_CLIENT or SSH2_CLIENT is set).
        code, timed_out, cwd = run(["bash", "--norc", "--noprofile", "-c", RUNNER, "warden-bash", command],
                                   env, timeout, grace, out, err)
    finally:
        os.chdir(WS)
    if cwd is not None:
        frame(b"s", os.fsencode(cwd))
    if workspace_full():
        err.seek(0, 2)
        err.write(b"[the session workspace is full: it reached its sandbox.disk limit]\n")
    out_total = send_capture(b"o", out, cap, None)
    err_total = send_capture(b"e", err, cap, None)
    result(status="ok", code=code, timed_out=int(timed_out), out_total=out_total, err_total=err_total,
           poisoned=int(container_poisoned(RECORD[0])))


def op_contain(f):
    """After a session process's call (the host's `Sandbox::contain`): what settled session
    processes started and their records do not hold, then the orphans, are killed, so
    nothing the call started outlives it."""
    killed = contain_session_processes() + sweep(False)
    return result(status="ok", killed=killed)


def workspace_full():
    try:
        st = os.statvfs(WS)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < FULL_BELOW


def drop_privileges(uid, gid):
    """Root with CAP_SETUID/CAP_SETGID only: become the sandbox user for good. The change
    of credentials also clears the dumpable flag, so processes of that user cannot reach
    this agent's /proc entries."""
    if os.getuid() == 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        sys.stderr.write("warden agent: could not become %d:%d\n" % (uid, gid))
        raise SystemExit(4)


def start_time(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        raw = f.read()
    return int(raw[raw.rfind(b")") + 2:].split()[19])


def open_mark(flags):
    """The use mark, if it is root's regular file (an older container has none; one a
    sandboxed process made is not believed); None otherwise."""
    try:
        fd = os.open(USE_MARK, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    st = os.fstat(fd)
    if st.st_uid != 0 or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd


def mark_use(fd, start):
    """Around a request: lock (shared, so agents never wait for each other) and write at
    its start, write and unlock at its end."""
    if fd is None:
        return
    try:
        if start:
            fcntl.flock(fd, fcntl.LOCK_SH)
        os.pwrite(fd, b"u", 0)
        if not start:
            fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        pass


def use_hold(seconds):
    """Root: answers `in-use` while any agent runs a request or the mark was written less
    than `seconds` ago, `none` without a mark; else answers `idle` and keeps the mark
    locked (no agent starts a request) until the host closes stdin: it removes the
    container meanwhile, so no call can start between its check and the removal."""
    fd = open_mark(os.O_RDONLY)
    if fd is None:
        return answer(b"none")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return answer(b"in-use")
    if time.time() - os.fstat(fd).st_mtime < seconds:
        return answer(b"in-use")
    answer(b"idle")
    while sys.stdin.buffer.read(CHUNK):
        pass


def answer(word):
    OUT.write(word + b"\n")
    OUT.flush()


def settings_of(pid):
    """What a command of this user can change about a process of its user, and so about
    every command that process starts later (they inherit it), as bytes: resource limits
    (`prlimit --pid`), niceness (`renice`), scheduling policy (`chrt`) and CPU affinity
    (`taskset -p`). Read from /proc (no `resource` module in python3-minimal)."""
    limits = limits_of(pid)
    with open("/proc/%s/stat" % pid, "rb") as f:
        raw = f.read()
    nice = raw[raw.rfind(b")") + 2:].split()[16]
    n = 0 if pid == "self" else int(pid)
    cpus = b",".join(b"%d" % c for c in sorted(os.sched_getaffinity(n)))
    return limits + b"nice %s\npolicy %d\ncpus %s\n" % (nice, os.sched_getscheduler(n), cpus)


def limits_of(pid):
    with open("/proc/%s/limits" % pid, "rb") as f:
        return f.read()


def recorded_limits():
    """SETTINGS_RECORD if it is root's regular file (a container made before it existed
    has none), else None."""
    try:
        fd = os.open(SETTINGS_RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != 0 or not stat.S_ISREG(st.st_mode):
            return None
        return f.read(MAX_RECORD_BYTES)


def container_poisoned(record):
    """Whether the limits of the container's init (root's: no sandboxed process can change
    them itself) differ from those `prepare` recorded. Under gVisor one limit set is shared
    by init and every exec of the container, so a command's `prlimit` of any process
    changes it: then every process of the container, the next agents, session processes
    and the egress forwarder included, has the command's limits, and only a new container
    has the operator's."""
    try:
        return record is not None and limits_of(1) != record
    except OSError:
        return False  # no /proc/1 to read (a hidepid mount): nothing to compare with


def agent_changed():
    """Whether this agent's settings differ from the container's init's (runc: a command
    changed this process only)."""
    try:
        return settings_of("self") != settings_of(1)
    except OSError:
        return False


def root_owned(path, kind):
    """Whether `path` (not followed) is root's and of `kind` (stat.S_ISDIR/S_ISREG)."""
    st = os.lstat(path)
    return st.st_uid == 0 and kind(st.st_mode)


def prepare(forwarder_port):
    """Root, once when the container starts, before any sandboxed code runs: opens
    /workspace to the session user (sticky, like /tmp; a fresh ext4 workspace's lost+found
    goes), makes the use mark, the sweep lock, the settled-process records' directory, the
    tools' configuration directory (with its empty .curlrc) and the limits record, all
    root's (one of them that exists and is not root's fails the setup: the host does not
    use the container); with egress, waits until the forwarder listens on
    `forwarder_port`. A record that exists (another replica prepared the container) is
    kept as it is."""
    os.chmod(WS, 0o1777)
    try:
        os.rmdir(WS + "/lost+found")
    except OSError:
        pass
    for mark in (USE_MARK, SWEEP_LOCK):
        try:
            os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        except FileExistsError:
            pass
    for d in (SETTLED, TOOL_CONFIG_DIR):
        try:
            os.mkdir(d)
            os.chmod(d, 0o755)
        except FileExistsError:
            if not root_owned(d, stat.S_ISDIR):
                return PREPARE_UNTRUSTED
    curlrc = TOOL_CONFIG_DIR + "/.curlrc"
    os.close(os.open(curlrc, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644))
    if not root_owned(curlrc, stat.S_ISREG) or os.lstat(curlrc).st_size:
        return PREPARE_UNTRUSTED
    try:
        fd = os.open(SETTINGS_RECORD, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(limits_of("self"))
    except FileExistsError:
        if not root_owned(SETTINGS_RECORD, stat.S_ISREG):
            return PREPARE_UNTRUSTED
    if forwarder_port:
        import socket
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", forwarder_port), 0.2).close()
                return 0
            except OSError:
                time.sleep(0.05)
        return FORWARDER_NOT_READY
    return 0


def serve(uid, gid):
    mark = open_mark(os.O_WRONLY)
    open_sweep_lock()
    drop_privileges(uid, gid)
    os.chdir(WS)
    # An agent whose settings are not the container's init's (a command lowered its limits
    # or raised its niceness) serves nothing more: it exits before the next request, which
    # the host gives to a new agent; in a container whose init's limits are not the ones
    # recorded at its start (gVisor shares them with every process), the host replaces the
    # container. So no command inherits what an earlier one set.
    record = recorded_limits()
    RECORD[0] = record
    me = os.getpid()
    frame(b"h", fields_bytes(["pid", me, "starttime", start_time(me)]))
    OUT.flush()
    ops = {"stat": op_stat, "read": op_read, "write": op_write, "exec": op_exec, "bash": op_bash,
           "contain": op_contain}
    while True:
        fields = read_request()
        if fields is None:
            return
        if container_poisoned(record):
            raise SystemExit(CONTAINER_POISONED)
        if agent_changed():
            raise SystemExit(AGENT_RETIRED)
        if len(fields) < 2:
            raise SystemExit(3)
        NONCE[0] = fields[1]
        fields = [fields[0]] + fields[2:]
        name = fields[0].decode("ascii", "replace")
        op = ops.get(name)
        mark_use(mark, True)
        try:
            if op is None:
                result(status="error", message="unknown operation")
            else:
                if name in FILE_OPS:
                    # Orphans belong to no live call: whatever one left running (a daemon
                    # a session process's call double-forked) ends before this file op.
                    sweep(False)
                op(fields)
        except Refused as r:
            result(status="refused", message=str(r))
        except (IndexError, ValueError, UnicodeError):
            result(status="refused", message="malformed request")
        except OSError as e:
            result(status="error", message=os_message(e))
        finally:
            mark_use(mark, False)
        OUT.flush()


def kill_agent(pid, starttime):
    """Kills an overrunning agent (only if pid still names the same process) with its
    whole tree, then the orphans."""
    try:
        alive = start_time(pid) == starttime
    except (OSError, ValueError, IndexError):
        alive = False
    if alive:
        table = proc_table()
        doomed = [p for p in table if p == pid or root_of(p, table) == pid]
        stop_then_kill(doomed)
    return sweep(False)


def exec_owned(argv):
    """Becomes `argv` (same pid, same start time) after telling the host who it is: one
    line `<pid> <starttime>` on stdout, so the host can end it and its tree on purpose
    (`kill-agent`) when what started it is over. Runs as the sandbox user."""
    me = os.getpid()
    os.write(1, b"%d %d\n" % (me, start_time(me)))
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        os.write(2, ("cannot run %r: %s\n" % (argv[0], e.strerror)).encode())
        os._exit(127)


def agent_tag(pid):
    """(replica, life) from the command line of a tagged agent
    (`python3 -I -S -c CODE serve UID GID REPLICA LIFE`, or `prepare-serve PORT UID GID
    REPLICA LIFE`), else None."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    if len(argv) >= 10 and argv[5] == b"serve":
        return argv[8], argv[9]
    if len(argv) >= 11 and argv[5] == b"prepare-serve":
        return argv[9], argv[10]
    return None


def sweep_lives(replica, life):
    """Kills the agents of `replica`'s earlier lives (same replica, another life) and their
    trees; other replicas' agents and calls, and orphans (swept by whichever command ends
    next), are left. Returns how many were killed."""
    me, uid = os.getpid(), os.getuid()
    replica, life = os.fsencode(replica), os.fsencode(life)

    def victims(table):
        dead = set()
        for pid, (ppid, puid, _, _) in table.items():
            if ppid == 0 and puid == uid and pid != me:
                tag = agent_tag(pid)
                if tag is not None and tag[0] == replica and tag[1] != life:
                    dead.add(pid)
        return [pid for pid, (_, puid, _, state) in table.items()
                if puid == uid and pid not in (1, me) and state not in DEAD_STATES and root_of(pid, table) in dead]
    return kill_in_rounds(victims)


def as_sandbox_user(argv):
    """The once-off sweeps (`<mode> <uid> <gid> ...`): started as root, they take the sweep
    lock and drop to the sandbox user before anything else."""
    open_sweep_lock()
    drop_privileges(int(argv[2]), int(argv[3]))
    return argv[4:]


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "serve":
        serve(int(sys.argv[2]), int(sys.argv[3]))
    elif mode == "prepare-serve":
        # The container's preparation and its first agent in one exec (an exec round trip
        # less at every cold start, pool fill and resume): prepare as root, then serve.
        code = prepare(int(sys.argv[2]))
        if code:
            sys.exit(code)
        serve(int(sys.argv[3]), int(sys.argv[4]))
    elif mode == "sweep-all":
        as_sandbox_user(sys.argv)
        sys.stdout.write("%d\n" % sweep(True))
    elif mode == "sweep-lives":
        args = as_sandbox_user(sys.argv)
        sys.stdout.write("%d\n" % sweep_lives(args[0], args[1]))
    elif mode == "use-hold":
        use_hold(int(sys.argv[2]))
    elif mode == "kill-agent":
        args = as_sandbox_user(sys.argv)
        kill_agent(int(args[0]), int(args[1]))
    elif mode == "exec-owned" and len(sys.argv) > 2:
        exec_owned(sys.argv[2:])
    elif mode == "settle":
        sys.exit(settle(int(sys.argv[2]), int(sys.argv[3]), os.fsencode(sys.argv[4])))
    elif mode == "prepare":
        sys.exit(prepare(int(sys.argv[2])))
    else:
        sys.exit(2)
