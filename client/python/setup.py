"""The wheel (tools/build_wheel.sh builds it): the dmagather package with
libdmagather.so and the daemon and CLI (bin/dmagatherd, bin/dmagatherctl)
inside it, and dmagather_autoload.pth at the top of site-packages (the
DMAGATHER_ALLGATHER=1 start-up hook). Tagged py3-none-<plat>: pure Python plus
a shared library loaded by ctypes and two programs (no CPython ABI)."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


class BuildPy(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join(HERE, "dmagather_autoload.pth"),
                       os.path.join(self.build_lib, "dmagather_autoload.pth"))


class Wheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


for f in ("libdmagather.so", "bin/dmagatherd", "bin/dmagatherctl"):
    if not os.path.exists(os.path.join(HERE, "dmagather", f)):
        raise SystemExit(f"dmagather/{f} is missing: build the wheel with tools/build_wheel.sh")
setup(distclass=BinaryDistribution, cmdclass={"build_py": BuildPy, "bdist_wheel": Wheel})
