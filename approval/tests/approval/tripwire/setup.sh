# Builds the tripwire image for the differential Bash test (run as root in a
# container of the sandbox image; the result is committed as a new image).
# Every executable except /usr/bin/echo becomes a tripwire that records its
# invocation in /trip/log; the real bash and python the harness needs live in
# a hidden directory.
set -euo pipefail
H=/opt/.w
mkdir -p "$H"
cp /usr/bin/bash "$H/bash"
cp "$(readlink -f /usr/bin/python3)" "$H/python3"
cat >"$H/harness.py" <<'WARDEN_HARNESS_EOF'
@HARNESS@
WARDEN_HARNESS_EOF
cat >"$H/tripwire" <<'WARDEN_TRIPWIRE_EOF'
#!/opt/.w/bash
{ printf 'exec %q' "$0"; printf ' %q' "$@"; printf '\n'; } >>/trip/log
exit 0
WARDEN_TRIPWIRE_EOF
chmod 755 "$H" "$H/bash" "$H/python3" "$H/tripwire"
chmod 644 "$H/harness.py"
PYTHONHOME=/usr "$H/python3" - <<'WARDEN_REPLACE_EOF'
import os, stat
keep = {"/usr/bin/echo"}
skip_dirs = ("/opt/.w", "/proc", "/sys", "/dev", "/usr/lib/python3")
count = 0
for root, dirs, files in os.walk("/"):
    if root.startswith(skip_dirs):
        dirs[:] = []
        continue
    for name in files:
        path = os.path.join(root, name)
        if path in keep or ".so" in name:
            continue
        st = os.lstat(path)
        in_bin = root in ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/usr/games")
        executable = stat.S_ISREG(st.st_mode) and st.st_mode & 0o111
        if in_bin or executable:
            os.unlink(path)
            os.symlink("/opt/.w/tripwire", path)
            count += 1
print(f"tripwire: replaced {count} executables")
WARDEN_REPLACE_EOF
