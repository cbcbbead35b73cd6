"""`dmagatherctl service install|remove|show`: the wheel's daemon as a node
service, for nodes without the Debian packages (Ubuntu, RHEL, Slurm clusters).

install writes what the .deb installs, pointed at this package's daemon:
  /etc/systemd/system/dmagatherd.service   the packaged unit (same hardening,
                                           Type=notify, Restart=on-failure),
                                           ExecStart = this package's dmagatherd
  /etc/tmpfiles.d/dmagather.conf           the socket directory at boot
  /etc/dmagather/dmagatherd.conf           the example configuration (kept if present)
then, unless --no-start, `systemctl daemon-reload` and `enable --now`.
remove stops and disables the unit and deletes the first two files (the
configuration stays, as dpkg keeps a conffile). show prints the unit.
--root DIR writes under DIR and runs no systemctl (images, tests)."""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# In the wheel: dmagather/deploy/ (tools/build_wheel.sh); in a checkout: deploy/.
DEPLOY = next((d for d in (os.path.join(HERE, "deploy"), os.path.join(HERE, "..", "..", "..", "deploy"))
               if os.path.isdir(d)), os.path.join(HERE, "deploy"))
UNIT = "etc/systemd/system/dmagatherd.service"
TMPFILES = "etc/tmpfiles.d/dmagather.conf"
CONFIG = "etc/dmagather/dmagatherd.conf"


def daemon_path():
    return os.path.join(HERE, "bin", "dmagatherd")


def unit_text(daemon):
    """The packaged unit with ExecStart at `daemon`. A package under /home or
    /root stays reachable: ProtectHome=read-only instead of yes."""
    with open(os.path.join(DEPLOY, "dmagatherd.service")) as f:
        text = f.read()
    if "ExecStart=/usr/bin/dmagatherd " not in text:
        raise SystemExit("dmagatherctl service: the packaged unit has no ExecStart=/usr/bin/dmagatherd line")
    text = text.replace("ExecStart=/usr/bin/dmagatherd ", f"ExecStart={daemon} ")
    if daemon.startswith(("/home/", "/root/", "/run/user/")):
        text = text.replace("ProtectHome=yes", "ProtectHome=read-only")
    return ("# Written by `dmagatherctl service install` for the dmagather package at\n"
            f"# {HERE}; `dmagatherctl service remove` removes it.\n" + text)


def write(root, rel, text, keep=False):
    path = os.path.join(root, rel)
    if keep and os.path.exists(path):
        print(f"kept      {path} (exists)")
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote     {path}")


def systemctl(*args):
    print("run       systemctl " + " ".join(args))
    return subprocess.run(["systemctl", *args]).returncode


def install(root, start):
    daemon = daemon_path()
    if not os.access(daemon, os.X_OK):
        raise SystemExit(f"dmagatherctl service: no daemon at {daemon}: this package was installed without it")
    with open(os.path.join(DEPLOY, "tmpfiles.d-dmagather.conf")) as f:
        tmpfiles = f.read()
    with open(os.path.join(DEPLOY, "dmagatherd.conf.example")) as f:
        config = f.read()
    write(root, UNIT, unit_text(daemon))
    write(root, TMPFILES, tmpfiles)
    write(root, CONFIG, config, keep=True)
    if root != "/" or not start:
        print("then:     systemctl daemon-reload && systemctl enable --now dmagatherd")
        return 0
    rc = systemctl("daemon-reload") or systemctl("enable", "--now", "dmagatherd.service")
    if rc == 0:
        print("dmagatherd is running: dmagatherctl health; remove with: dmagatherctl service remove")
    return rc


def remove(root, stop):
    if root == "/" and stop:
        systemctl("disable", "--now", "dmagatherd.service")
    for rel in (UNIT, TMPFILES):
        path = os.path.join(root, rel)
        if os.path.exists(path):
            os.remove(path)
            print(f"removed   {path}")
    if root == "/" and stop:
        systemctl("daemon-reload")
    print(f"kept      {os.path.join(root, CONFIG)} (delete it by hand if unwanted)")
    return 0


def main(argv):
    p = argparse.ArgumentParser(prog="dmagatherctl service", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("install", "remove", "show"))
    p.add_argument("--root", default="/", help="write under this directory instead of / (runs no systemctl)")
    p.add_argument("--no-start", action="store_true", help="install: do not reload, enable and start the unit")
    a = p.parse_args(argv)
    if a.action == "show":
        sys.stdout.write(unit_text(daemon_path()))
        return 0
    if a.root == "/" and os.geteuid() != 0:
        raise SystemExit("dmagatherctl service: writing to /etc needs root (sudo)")
    return install(a.root, not a.no_start) if a.action == "install" else remove(a.root, not a.no_start)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
