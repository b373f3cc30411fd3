# Differential Bash test harness (runs inside the tripwire container as an
# unprivileged user on a read-only root). Reads one hex-encoded command per line on
# stdin, runs it the way the sandbox's Bash tool does (`bash -c ... eval "$1"`)
# in an empty working directory, and prints one JSON line per command: what
# the tripwires recorded, every file that appeared anywhere writable, the exit
# status and whether it timed out. Cleans up between commands.
import os, signal, subprocess, sys

# The sandbox image has python3-minimal: no json, no shutil.


def js(v):
    """JSON for None, bool, int, str and lists/dicts of them."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        out = []
        for ch in v:
            if ch in '"\\':
                out.append("\\" + ch)
            elif ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 or 0xD800 <= ord(ch) < 0xE000:
                out.append("\\u%04x" % ord(ch))
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    if isinstance(v, list):
        return "[" + ",".join(js(x) for x in v) + "]"
    return "{" + ",".join(js(k) + ":" + js(x) for k, x in v.items()) + "}"

BASH = "/opt/.w/bash"
LOG = "/trip/log"
WORK = "/work"
TIMEOUT = float(os.environ.get("WARDEN_CASE_TIMEOUT", "5"))
# A command bash cannot find is also a command the recognizer did not see,
# and so is any simple command (builtins too: the DEBUG trap, inherited by
# subshells and substitutions through `set -T`) whose command word is not
# `echo`. BASH_COMMAND is bash's own rendering of the parsed command. After a
# bare `time` bash runs the trap for the trap's own last command (`__in=`);
# that one is not the command under test, and neither is a command made of
# redirections only (no command word: no program runs).
RUNNER = r"""command_not_found_handle() { printf 'not found: %q\n' "$1" >>/trip/log; return 127; }
__warden_debug() {
  local w=${__c%%[[:space:]]*}
  w=${w//\"/}; w=${w//\'/}; w=${w//\\/}
  local redirect_only='^[0-9]*[<>&]'
  [[ $w == echo || $w =~ $redirect_only || $__c == 'eval "$1"' || $__c == __in=* ]] ||
    printf 'ran: %q\n' "$__c" >>/trip/log
}
set -T
trap '[[ -n $__in ]] || { __in=1; __c=$BASH_COMMAND; __warden_debug; __in=; }' DEBUG
eval "$1"
"""
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": WORK, "LANG": "C.UTF-8"}


def writable_dirs():
    """Every directory this user can write to (the root is read-only)."""
    found = []
    for root, dirs, _ in os.walk("/"):
        if root == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "sys")]
        if os.access(root, os.W_OK):
            found.append(root)
            dirs[:] = []
    return found


def entries(dirs):
    out = []
    for d in dirs:
        for root, ds, fs in os.walk(d):
            out.extend(os.path.join(root, x) for x in ds + fs)
    return out


def clean(paths):
    for p in sorted(paths, key=len, reverse=True):
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                os.rmdir(p)
            else:
                os.unlink(p)
        except OSError:
            pass


def reap():
    """Collect orphans (background jobs re-parented to us) so no zombie
    counts against the container's process limit."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main():
    dirs = writable_dirs()
    before = entries(dirs)
    print(js({"writable": dirs, "preexisting": before}), flush=True)
    for i, line in enumerate(sys.stdin):
        cmd = bytes.fromhex(line.strip())
        res = {"i": i, "rc": None, "timeout": False, "error": None}
        try:
            p = subprocess.Popen(
                [BASH.encode(), b"-c", RUNNER.encode(), b"warden-bash", cmd],
                cwd=WORK, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, start_new_session=True,
            )
            try:
                _, err = p.communicate(timeout=TIMEOUT)
                res["stderr"] = err[:400].decode("utf-8", "replace")
            except subprocess.TimeoutExpired:
                res["timeout"] = True
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
            res["rc"] = p.returncode
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
        except Exception as e:  # noqa: BLE001 - reported, never hidden
            res["error"] = repr(e)
        reap()
        found = [e for e in entries(dirs) if e not in before]
        trip = ""
        try:
            with open(LOG, encoding="utf-8", errors="replace") as f:
                trip = f.read()[:2000]
        except OSError:
            pass
        res["trip"] = trip
        res["files"] = found[:20]
        clean(found)
        print(js(res), flush=True)


main()
