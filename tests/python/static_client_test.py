"""libdmagather.so in a process that already has another gRPC and protobuf: each
rank process first loads Debian's grpcio (its own gRPC core in cygrpc, OpenSSL
from libssl.so.3) and protobuf's C++ implementation with RTLD_GLOBAL, as
trainer frameworks do, uses both against the real dmagatherd (a Telemetry/Health call, a message
serialized to known bytes), then loads libdmagather.so (whose gRPC is a
static, hidden copy), runs a bit-exact AllGather across three ranks, and calls
Health through grpcio again: both gRPC copies work side by side.

Run with Debian's /usr/bin/python3 (python3-grpcio, python3-protobuf, numpy).
"""
import hashlib
import json
import os
import subprocess
import sys
import unittest

RUNFILES = os.getcwd()
sys.path.insert(0, os.path.join(RUNFILES, "tests", "python"))
from daemon_case import DaemonTestCase  # noqa: E402
LIB = os.path.join(RUNFILES, "client", "libdmagather.so")
WORLD = 3
# (dtype, count): byte patterns cover every bit of every element.
CASES = [("uint8", 1 << 20), ("float32", 4097), ("int64", 3), ("bfloat16", 70001)]


def pattern(rank, case_index, nbytes):
    """Deterministic bytes rank `rank` contributes for case `case_index`."""
    out = bytearray()
    block = 0
    while len(out) < nbytes:
        out += hashlib.sha256(f"{rank}/{case_index}/{block}".encode()).digest()
        block += 1
    return bytes(out[:nbytes])


def itemsize(dtype):
    return {"uint8": 1, "float32": 4, "int64": 8, "bfloat16": 2}[dtype]


def health_messages():
    """HealthRequest/HealthReply classes built from a descriptor (no generated code)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    fdp = descriptor_pb2.FileDescriptorProto(name="dmagather_static_test/health.proto",
                                             package="dmagather.v1", syntax="proto3")
    fdp.message_type.add(name="HealthRequest")
    reply = fdp.message_type.add(name="HealthReply")
    fields = [("status", 9), ("version", 9), ("backend", 9), ("backend_reason", 9),
              ("uptime_s", 1), ("jobs", 5), ("sessions", 5), ("worker_threads", 5)]
    for number, (name, ftype) in enumerate(fields, 1):
        reply.field.add(name=name, number=number, type=ftype, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    factory = message_factory.MessageFactory(pool)
    return (factory.GetPrototype(pool.FindMessageTypeByName("dmagather.v1.HealthRequest")),
            factory.GetPrototype(pool.FindMessageTypeByName("dmagather.v1.HealthReply")))


def mapped_libraries():
    with open("/proc/self/maps") as f:
        return {os.path.basename(line.split()[-1]) for line in f if "/" in line}


def rank_main(sock, job, rank):
    """One rank; returns a dict the parent asserts on."""
    result = {"rank": rank}
    # 1. Another gRPC and protobuf, global, before libdmagather.so.
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_GLOBAL)
    import grpc
    from google.protobuf.internal import api_implementation
    result["protobuf_impl"] = api_implementation.Type()
    HealthRequest, HealthReply = health_messages()
    result["serialized"] = HealthReply(status="SERVING", jobs=3, uptime_s=0.5).SerializeToString().hex()
    channel = grpc.insecure_channel("unix:" + sock)
    health = channel.unary_unary("/dmagather.v1.Telemetry/Health",
                                 request_serializer=HealthRequest.SerializeToString,
                                 response_deserializer=HealthReply.FromString)
    before = health(HealthRequest(), timeout=30)
    result["health_before"] = [before.status, before.backend]
    maps = mapped_libraries()
    # Debian's grpcio has gRPC core inside cygrpc.*.so and takes OpenSSL from libssl.so.3.
    result["others_loaded"] = sorted({m.split(".")[0] for m in maps
                                      if m.startswith(("cygrpc.", "libprotobuf.so.", "libssl.so.", "libgrpc"))})

    # 2. libdmagather.so (ctypes) and an AllGather across the ranks.
    os.environ["DMAGATHER_LIB"] = LIB
    sys.path.insert(0, os.path.join(RUNFILES, "client", "python"))
    import numpy as np
    import dmagather
    digests = []
    with dmagather.Comm(job, WORLD, rank, socket=sock) as comm:
        for i, (dt, count) in enumerate(CASES):
            isz = itemsize(dt)
            out = comm.empty(WORLD * count, dt)
            raw = out.view(np.uint8)
            raw[:] = 0xA5  # anything the gather fails to write shows up
            raw[rank * count * isz:(rank + 1) * count * isz] = np.frombuffer(
                pattern(rank, i, count * isz), dtype=np.uint8)
            comm.allgather(out[rank * count:(rank + 1) * count], out, count=count, dtype=dt)
            comm.wait()
            got = raw.tobytes()
            want = b"".join(pattern(r, i, count * isz) for r in range(WORLD))
            if got != want:
                first = next(k for k in range(len(want)) if got[k] != want[k])
                raise AssertionError(f"{dt} count={count}: first differing byte {first}")
            digests.append(hashlib.sha256(got).hexdigest())
            comm.free(out)
        result["backend"] = comm.backend
    result["digests"] = digests

    # 3. grpcio still works next to libdmagather's own gRPC.
    after = health(HealthRequest(), timeout=30)
    result["health_after"] = [after.status, after.backend, after.version]
    channel.close()
    return result


class StaticClientTest(DaemonTestCase):
    DAEMON_PREFIX = "dmagather-static-"

    def test_allgather_next_to_grpcio_and_cpp_protobuf(self):
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "rank", self.sock, "static-job",
                                   str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(WORLD)]
        results = {}
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=180)
            self.assertEqual(p.returncode, 0, f"rank {r} failed:\n{err[-4000:]}")
            results[r] = json.loads(out.strip().splitlines()[-1])
        want_digests = [hashlib.sha256(b"".join(pattern(r, i, count * itemsize(dt)) for r in range(WORLD)))
                        .hexdigest() for i, (dt, count) in enumerate(CASES)]
        for r in range(WORLD):
            res = results[r]
            self.assertEqual(res["rank"], r)
            self.assertEqual(res["protobuf_impl"], "cpp")
            # field 1 "SERVING", field 5 double 0.5, field 6 varint 3
            self.assertEqual(res["serialized"], "0a0753455256494e47" + "29000000000000e03f" + "3003")
            self.assertEqual(res["health_before"], ["SERVING", "host"])
            self.assertEqual(res["others_loaded"], ["cygrpc", "libprotobuf", "libssl"])
            self.assertEqual(res["backend"], "host")
            self.assertEqual(res["digests"], want_digests)
            self.assertEqual(res["health_after"][:2], ["SERVING", "host"])
            self.assertTrue(res["health_after"][2])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        print(json.dumps(rank_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        unittest.main()
