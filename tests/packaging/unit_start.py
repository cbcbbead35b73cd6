"""Starts a service the way systemd would from its installed unit file, in a
root where systemd does not run (a chroot): reads the unit's [Service]
section, loads EnvironmentFile= (a leading '-' = optional), makes
RuntimeDirectory= (with RuntimeDirectoryMode=), applies LimitNOFILE= and
LimitMEMLOCK=, expands $VAR (split into words) and ${VAR} (one word) in
ExecStart= as systemd does, and for Type=notify hands the process a
NOTIFY_SOCKET and waits for its READY=1. Prints `pid N` once it is ready;
exits 1 (with the log's tail) when the process exits first or is not ready in
time.

    python3 unit_start.py UNIT_FILE LOG_FILE [TIMEOUT_S]
"""
import os
import re
import resource
import shlex
import socket
import subprocess
import sys
import tempfile
import time


def parse_unit(path):
    service, section = {}, None
    with open(path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line
                continue
            if section == "[Service]" and "=" in line:
                k, v = line.split("=", 1)
                service.setdefault(k.strip(), []).append(v.strip())
    return service


def load_env_file(path, env):
    optional = path.startswith("-")
    path = path.lstrip("-")
    if not os.path.exists(path):
        if optional:
            return
        raise SystemExit(f"EnvironmentFile {path} missing")
    with open(path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line[0] in "#;" or "=" not in line:
                continue
            k, v = line.split("=", 1)
            words = shlex.split(v)
            env[k.strip()] = " ".join(words)


def expand(cmdline, env):
    out = []
    for word in shlex.split(cmdline):
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:  # $VAR: its value split at white space
            out.extend(env.get(m.group(1), "").split())
            continue
        out.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda mm: env.get(mm.group(1), ""), word))
    return out


def limit(value):
    return resource.RLIM_INFINITY if value == "infinity" else int(value)


def main():
    unit, log = sys.argv[1], sys.argv[2]
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 60
    svc = parse_unit(unit)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    for p in svc.get("EnvironmentFile", []):
        load_env_file(p, env)
    mode = int(svc.get("RuntimeDirectoryMode", ["0755"])[-1], 8)
    for names in svc.get("RuntimeDirectory", []):
        for n in names.split():
            d = os.path.join("/run", n)
            os.makedirs(d, exist_ok=True)
            os.chmod(d, mode)
    argv = expand(svc["ExecStart"][-1].lstrip("@-:+!"), env)

    def limits():
        os.setsid()
        for key, res in (("LimitNOFILE", resource.RLIMIT_NOFILE), ("LimitMEMLOCK", resource.RLIMIT_MEMLOCK)):
            if key in svc:
                v = limit(svc[key][-1])
                try:
                    resource.setrlimit(res, (v, v))
                except (ValueError, OSError):
                    pass

    notify = svc.get("Type", ["simple"])[-1] == "notify"
    sock = None
    if notify:
        path = os.path.join(tempfile.mkdtemp(prefix="notify-"), "notify.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        env["NOTIFY_SOCKET"] = path
    with open(log, "ab") as lf:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=lf, stderr=lf, preexec_fn=limits,
                                close_fds=True)
    print("exec " + " ".join(argv), flush=True)
    deadline = time.monotonic() + timeout
    ready = not notify
    while not ready and time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        sock.settimeout(0.2)
        try:
            msg = sock.recv(4096).decode(errors="replace")
        except socket.timeout:
            continue
        ready = "READY=1" in msg.split("\n")
    if not ready or proc.poll() is not None:
        with open(log, errors="replace") as f:
            sys.stdout.write(f.read()[-3000:])
        print(f"not ready (exit status {proc.poll()})", flush=True)
        if proc.poll() is None:
            proc.kill()
        return 1
    print(f"pid {proc.pid}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
