"""The wheel (tools/build_wheel.sh, client/python/pyproject.toml): built, then
`pip install` into a fresh venv with nothing else of dmagather (no checkout on
the path, no DMAGATHER_LIB) is enough:

- the package and its libdmagather.so come from the venv's site-packages, and
  the library's dependencies resolve from the wheel itself (ldd: nothing from
  Debian's Abseil/protobuf/RE2, nothing "not found");
- the daemon and the CLI are the venv's `dmagatherd` and `dmagatherctl`
  commands: the programs inside the package, every library they map that is
  not the C/C++ runtime from the wheel (nothing of the build tree, nothing of
  Debian's gRPC/Abseil/protobuf); health SERVING, /metrics answers;
- the start-up hook came with it (DMAGATHER_ALLGATHER=1 patches torch.distributed);
- python -m dmagather.check --world 4 against that daemon: PASSED.

torch for the check comes from the trainer venv (a path entry in the new venv).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.request

from trainers_case import Daemon, TrainerCase, REPO

# What a manylinux wheel may take from the node (the C and C++ runtimes).
SYSTEM_LIBS = ("linux-vdso", "libc.so", "libm.so", "libpthread", "libdl.so", "librt.so", "ld-linux", "libstdc++",
               "libgcc_s", "libatomic", "libz.so")


PROBE = ("import json, os, sys, dmagather, torch.distributed as d; l = dmagather.load_library(); "
         "print(json.dumps({'pkg': dmagather.__file__, 'lib': l._name, "
         "'patched': hasattr(d.all_gather_into_tensor, '_dmagather_original')}))")


def wheel_daemon(venv):
    """The venv's `dmagatherd` command on a private socket, with an
    environment that names nothing of the build tree."""
    env = {"PATH": os.path.join(venv, "bin") + ":/usr/bin:/bin"}
    return Daemon(os.path.join(venv, "bin", "dmagatherd"), ("--metrics_listen=127.0.0.1:0", "--log_level=info"), env)


class WheelTest(TrainerCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = None
        cls.dir = tempfile.mkdtemp(prefix="dmagather-wheel-", dir="/tmp")
        p = subprocess.run([os.path.join(REPO, "tools", "build_wheel.sh"), os.path.join(cls.dir, "dist")],
                           capture_output=True, text=True, timeout=900)
        cls.build = p
        m = re.search(r"^wheel: (.+)$", p.stdout, re.M)
        cls.wheel = m.group(1) if m else None
        cls.venv = os.path.join(cls.dir, "venv")
        cls.install = None
        if cls.wheel:
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", cls.venv], check=True, timeout=300)
            cls.py = os.path.join(cls.venv, "bin", "python")
            cls.install = subprocess.run([cls.py, "-m", "pip", "install", "--disable-pip-version-check", "--no-index",
                                          cls.wheel], capture_output=True, text=True, timeout=300)
            site = subprocess.run([cls.py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            cls.site = site
            import torch  # the trainer venv's: a plain path entry (its .pth files are not read from there)
            with open(os.path.join(site, "zz-trainer-venv-torch.pth"), "w") as f:
                f.write(os.path.dirname(os.path.dirname(torch.__file__)) + "\n")
            if cls.install.returncode == 0:
                cls.daemon = wheel_daemon(cls.venv)

    @classmethod
    def tearDownClass(cls):
        if cls.daemon is not None:
            cls.daemon.stop()
        if os.environ.get("DMAGATHER_KEEP_LOGS") != "1":
            shutil.rmtree(cls.dir, ignore_errors=True)

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DMAGATHER_", "PYTHONPATH"))}
        env.update(DMAGATHER_SOCKET=self.daemon.sock if self.daemon else "/nonexistent", **extra)
        return env

    def built(self):
        self.assertIsNotNone(self.wheel, self.build.stdout[-2000:] + self.build.stderr[-2000:])
        self.assertEqual(self.install.returncode, 0, self.install.stdout + self.install.stderr)

    def test_wheel_is_manylinux_with_its_libraries(self):
        self.built()
        self.assertRegex(os.path.basename(self.wheel), r"^dmagather-[\d.]+-py3-none-manylinux_2_\d+_x86_64")
        import zipfile
        names = zipfile.ZipFile(self.wheel).namelist()
        self.assertIn("dmagather_autoload.pth", names)
        self.assertIn("dmagather/libdmagather.so", names)
        self.assertIn("dmagather/bin/dmagatherd", names)
        self.assertIn("dmagather/bin/dmagatherctl", names)
        entry = zipfile.ZipFile(self.wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
        self.assertIn("dmagatherd = dmagather._commands:dmagatherd", entry)
        self.assertIn("dmagatherctl = dmagather._commands:dmagatherctl", entry)
        self.assertTrue(any(n.startswith("dmagather.libs/libprotobuf") for n in names), names)

    def test_installed_package_loads_its_own_library(self):
        self.built()
        import json
        p = subprocess.run([self.py, "-c", PROBE], env=self.env(DMAGATHER_ALLGATHER="1"), capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertTrue(got["pkg"].startswith(self.site), got)
        self.assertTrue(got["lib"].startswith(os.path.join(self.site, "dmagather")), got)
        self.assertTrue(got["patched"], got)
        ldd = subprocess.run(["ldd", got["lib"]], capture_output=True, text=True).stdout
        self.assertNotIn("not found", ldd)
        for name in ("libprotobuf", "libabsl_", "libre2"):
            for line in ldd.splitlines():
                if name in line:
                    self.assertIn("dmagather.libs", line, line)

    def test_daemon_and_cli_are_the_wheels_own(self):
        self.built()
        d = self.daemon

        def log():
            with open(d.log_path) as f:
                return f.read()

        self.assertIsNone(d.proc.poll(), log())
        exe = os.readlink(f"/proc/{d.proc.pid}/exe")
        self.assertEqual(exe, os.path.join(self.site, "dmagather", "bin", "dmagatherd"))
        with open(f"/proc/{d.proc.pid}/maps") as f:
            mapped = sorted({line.split()[-1] for line in f if ".so" in line.split()[-1]})
        foreign = [m for m in mapped if "dmagather.libs" not in m and
                   not any(os.path.basename(m).startswith(x) for x in SYSTEM_LIBS)]
        self.assertEqual(foreign, [], f"libraries of the daemon from outside the wheel: {foreign}")
        self.assertTrue(any("dmagather.libs/libgrpc" in m for m in mapped), mapped)
        p = subprocess.run([os.path.join(self.venv, "bin", "dmagatherctl"), f"--socket={d.sock}", "health"],
                           capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertRegex(p.stdout, r"status:\s+SERVING")
        self.assertRegex(p.stdout, r"built:\s+.*host")
        m = re.search(r"metrics on http://(127\.0\.0\.1:\d+)/metrics", log())
        self.assertIsNotNone(m, log())
        body = urllib.request.urlopen(f"http://{m.group(1)}/metrics", timeout=10).read().decode()
        self.assertIn('dmagather_up{version="', body)

    def test_service_command_writes_the_packaged_unit_for_the_wheels_daemon(self):
        self.built()
        root = os.path.join(self.dir, "root")
        ctl = [os.path.join(self.venv, "bin", "dmagatherctl"), "service"]
        env = {"PATH": "/usr/bin:/bin"}
        p = subprocess.run(ctl + ["install", "--root", root], capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        unit_path = os.path.join(root, "etc/systemd/system/dmagatherd.service")
        unit = open(unit_path).read()
        daemon = os.path.join(self.site, "dmagather", "bin", "dmagatherd")
        self.assertIn(f"ExecStart={daemon} --socket=/run/dmagather/dmagatherd.sock $DMAGATHERD_ARGS", unit)
        # Every other line as the .deb's unit has it (the hardening, Type=notify, Restart=).
        packaged = open(os.path.join(REPO, "deploy", "dmagatherd.service")).read().splitlines()
        body = [line for line in unit.splitlines() if not line.startswith(("# Written by", "# /", "ExecStart="))]
        self.assertEqual([line for line in packaged if not line.startswith("ExecStart=")],
                         [line for line in body if not line.startswith("# " + self.site)])
        self.assertEqual(open(os.path.join(root, "etc/tmpfiles.d/dmagather.conf")).read(),
                         open(os.path.join(REPO, "deploy", "tmpfiles.d-dmagather.conf")).read())
        config = os.path.join(root, "etc/dmagather/dmagatherd.conf")
        with open(config, "a") as f:
            f.write("# edited by the admin\n")
        p = subprocess.run(ctl + ["install", "--root", root], capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("# edited by the admin", open(config).read(), "an existing configuration is kept")
        # systemd's own check of the unit as written (as tools/check_unit.sh does for the .deb's).
        if shutil.which("systemd-analyze"):
            v = subprocess.run(["systemd-analyze", "verify", unit_path], capture_output=True, text=True, timeout=60)
            out = [line for line in (v.stdout + v.stderr).splitlines() if "nvidia-persistenced" not in line]
            if not any(x in (v.stdout + v.stderr) for x in ("Failed to initialize manager", "Failed to connect to bus",
                                                             "Operation not permitted")):
                self.assertEqual((v.returncode, out), (0, []), "systemd-analyze verify of the written unit")
        p = subprocess.run(ctl + ["remove", "--root", root], capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertFalse(os.path.exists(unit_path))
        self.assertFalse(os.path.exists(os.path.join(root, "etc/tmpfiles.d/dmagather.conf")))
        self.assertTrue(os.path.exists(config), "the configuration stays, as dpkg keeps a conffile")

    def test_check_module_after_pip_install(self):
        self.built()
        p = subprocess.run([self.py, "-m", "dmagather.check", "--world", "4"], env=self.env(), capture_output=True,
                           text=True, timeout=300, cwd=self.dir)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        for dt in ("bfloat16", "float16", "float32"):
            self.assertRegex(p.stdout, rf"{dt}\s+PASSED")


if __name__ == "__main__":
    unittest.main()
