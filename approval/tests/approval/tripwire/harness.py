# Differential Bash test harness (runs inside the tripwire container as an
# unprivileged user on a read-only root). Reads one hex-encoded command per line on
# stdin, runs it the way the sandbox's Bash tool does (`bash -c ... eval "$1"`)
# in a working directory holding only planted state, and prints one JSON line per
# command: what the tripwires recorded, every file that appeared anywhere writable,
# the exit status and whether it timed out. Cleans up between commands.
#
# Planted state (issue 40): what earlier approved commands of a session could have
# left behind, so that an allowed command that reads it is caught: exported
# variables whose values are code once evaluated (`pv`, `qv`, `g`: `getopts g NAME -g` assigns `g`), a `BASH_ENV` file, a
# directory of programs named like common ones (`PLANTED_BIN`, for a command to put on `PATH`),
# git and XDG configuration that runs a command (`core.fsmonitor`, hooks) under
# `HOME`, and `SECONDS` read once (which gives it the integer attribute).
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
WORK = "/scratch"
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
  local redirect_only='^[0-9]*[<>&]' assignment='^[A-Za-z_][A-Za-z0-9_]*[+]?='
  case $w in echo|export|declare|typeset|local|readonly|read|getopts|cd|test|'['|set|trap|hash|history|fc|alias|unalias|complete|compgen|compopt|mapfile|readarray|command|exec) return ;; esac
  [[ $__c == 'git status' || $w =~ $assignment ]] && return
  [[ $w == echo || $w =~ $redirect_only || $__c == 'eval "$1"' || $__c == __in=* ]] ||
    printf 'ran: %q\n' "$__c" >>/trip/log
}
: "$SECONDS"
export BASH_ENV=/scratch/.planted-env
set -T
trap '[[ -n $__in ]] || { __in=1; __c=$BASH_COMMAND; __warden_debug; __in=; }' DEBUG
eval "$1"
"""
PLANTED_BIN = WORK + "/.planted-bin"
# Programs an allowed rule runs (`Bash(git status)`): their tripwire line at their real
# path is expected; the same name from anywhere else (the planted directory) is not.
EXPECTED = {"exec /usr/bin/git status"}
ENV = {
    # Not the planted directory: the sandbox never carries PATH over (a PATH that led
    # there would make every allowed program the planted one); commands put it first.
    "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
    "HOME": WORK,
    "LANG": "C.UTF-8",
    "XDG_CONFIG_HOME": WORK + "/.config",
    "pv": "x[$(touch /scratch/planted-pv)]",
    "qv": "$(touch /scratch/planted-qv)",
    "g": "x[$(touch /scratch/planted-g)]",
}
PLANTED_FILES = {
    # Sourced by every bash a command starts; builtins only (a program here would be a
    # tripwire whose own bash sources this file again). The tripwire itself is exempt:
    # its run is logged already, and an allowed program's run is expected.
    ".planted-env": "[[ $0 -ef /opt/.w/tripwire ]] || printf 'planted BASH_ENV ran: %q\\n' \"$0\" >>/trip/log\n",
    ".gitconfig": "[core]\n\tfsmonitor = touch /scratch/planted-fsmonitor\n",
    ".config/git/config": "[core]\n\tfsmonitor = touch /scratch/planted-xdg\n",
    ".git/config": "[core]\n\tfsmonitor = touch /scratch/planted-git\n\thooksPath = /scratch/.git/hooks\n",
    ".git/hooks/pre-commit": "#!/bin/sh\ntouch /scratch/planted-hook\n",
    ".env": "DOTENV-SECRET=1\n",
}
PLANTED_PROGRAMS = ["git", "ls", "cat", "echo", "true", "rm", "touch", "sh", "bash"]


def plant():
    """Leaves the state an approved command could have left (see the module docs)."""
    for rel, text in PLANTED_FILES.items():
        path = os.path.join(WORK, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    os.makedirs(PLANTED_BIN, exist_ok=True)
    for name in PLANTED_PROGRAMS:
        os.symlink("/opt/.w/tripwire", os.path.join(PLANTED_BIN, name))


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
    plant()
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
                lines = f.read().splitlines()
            trip = "".join(l + "\n" for l in lines if l not in EXPECTED)[:2000]
        except OSError:
            pass
        res["trip"] = trip
        res["files"] = [f for f in found if f != LOG][:20]
        clean(found + [LOG])
        print(js(res), flush=True)


main()
