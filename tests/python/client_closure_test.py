"""What libdmagather.so brings into a process: gRPC, OpenSSL, c-ares, upb and
zlib are inside it (static, hidden), so no shared object of theirs is needed
and no symbol of theirs is imported; the only exported symbols are the C ABI
functions declared in dmagather.h. protobuf, re2 and Abseil are still shared
libraries: Debian 12 builds their archives as PIE, not PIC, so they cannot go
into a shared object (see third_party/system/BUILD, grpc_static)."""
import os
import re
import subprocess
import unittest

RUNFILES = os.getcwd()
LIB = os.path.join(RUNFILES, "client", "libdmagather.so")
HEADER = os.path.join(RUNFILES, "client", "include", "dmagather", "dmagather.h")

# Linked statically: neither needed nor reachable through ldd.
STATIC = ["libgrpc++", "libgrpc", "libgpr", "libupb", "libaddress_sorting", "libcares", "libssl",
          "libcrypto", "libz"]
# System libraries any C++ shared object may need.
SYSTEM = ["libc.so", "libstdc++.so", "libm.so", "libgcc_s.so", "ld-linux-x86-64.so", "libpthread.so",
          "libdl.so", "librt.so"]
# Shared because Debian's archives are not PIC (and what they need: libprotobuf.so needs libz.so).
NOT_PIC = ["libprotobuf.so", "libre2.so", "libabsl_"]
# Imported symbols that would mean a static library's code is being taken from elsewhere.
STATIC_SYMBOL_PREFIXES = ["grpc_", "gpr_", "_ZN4grpc", "_ZN9grpc_core", "_ZN17grpc_event_engine", "upb_",
                          "ares_", "SSL_", "EVP_", "OPENSSL_", "CRYPTO_", "deflate", "inflate", "address_sorting"]


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def base(lib):
    """libgrpc++.so.1.51 -> libgrpc++ ; libz.so.1 -> libz"""
    return os.path.basename(lib).split(".so")[0]


class ClientClosureTest(unittest.TestCase):
    def test_needed_libraries_are_system_or_not_pic(self):
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run("readelf", "-d", LIB))
        self.assertIn("libstdc++.so.6", needed)
        for lib in needed:
            self.assertNotIn(base(lib), STATIC, f"{lib} should be linked statically")
            self.assertTrue(any(lib.startswith(p) for p in SYSTEM + NOT_PIC), f"unexpected DT_NEEDED {lib}")

    def test_ldd_closure_has_no_grpc_ssl_cares_upb(self):
        out = run("ldd", LIB)
        self.assertNotIn("not found", out)
        libs = [line.split()[0] for line in out.splitlines() if line.strip()]
        self.assertIn("libc.so.6", libs)
        for lib in libs:
            # zlib is reached only through libprotobuf.so (libdmagather's own zlib is inside it).
            if base(lib) == "libz":
                continue
            self.assertNotIn(base(lib), STATIC, f"ldd lists {lib}")

    def test_exports_exactly_the_c_abi(self):
        with open(HEADER) as f:
            declared = set(re.findall(r"\b(dmagather_[a-z_0-9]+)\s*\(", f.read()))
        self.assertGreater(len(declared), 10)
        exported = set()
        for line in run("nm", "-D", "--defined-only", LIB).splitlines():
            _addr, kind, name = line.split()[-3:]
            # Lower-case kinds are local (ld.gold keeps local TLS symbols in .dynsym for their
            # relocations); u, v, w are still global (unique, weak).
            if kind.isupper() or kind in "uvw":
                exported.add(name)
        self.assertEqual(exported, declared)

    def test_no_static_library_symbol_is_imported(self):
        undefined = [line.split()[-1] for line in run("nm", "-D", "--undefined-only", LIB).splitlines()]
        self.assertGreater(len(undefined), 0)
        leaked = [u for u in undefined if u.startswith(tuple(STATIC_SYMBOL_PREFIXES))]
        self.assertEqual(leaked, [])

    def test_no_executable_stack_or_text_relocations(self):
        dyn = run("readelf", "-d", LIB)
        self.assertNotIn("TEXTREL", dyn)
        stack = [line for line in run("readelf", "-lW", LIB).splitlines() if "GNU_STACK" in line]
        self.assertEqual(len(stack), 1)
        self.assertNotIn("RWE", stack[0])


if __name__ == "__main__":
    unittest.main()
