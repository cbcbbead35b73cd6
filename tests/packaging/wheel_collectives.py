"""The wheel's Python package with nothing else (tests/packaging/wheel.sh): no
numpy, no torch. 3 rank processes (this file with --rank), each a
dmagather.Comm on the daemon's socket, run an all-gather and a reduce-scatter
(SUM) of float32 and bfloat16, out of place and in place, at 1, 1000 and
65537 elements per rank, in memory from Comm.alloc (ctypes; Comm.empty
needs numpy). Every output byte is compared with what this script computes:
the inputs are multiples of 1/4 (float32) and 1/2 (bfloat16) small enough
that every sum is exact, so the expected bytes are exact too.

    python wheel_collectives.py --socket PATH [--world 3]
        prints each rank's lines, then `PASS: ...` (exit 0) or `FAIL: ...` (exit 1)
"""
import argparse
import array
import ctypes
import importlib.util
import os
import struct
import subprocess
import sys
import time

COUNTS = (1, 1000, 65537)
SIZES = {"float32": 4, "bfloat16": 2}


def value(dtype, rank, chunk, i):
    """Rank `rank`'s input element i of chunk `chunk` (the all-gather: chunk 0)."""
    if dtype == "float32":
        return (((i * 7 + rank * 13 + chunk * 29) % 2001) - 1000) / 4  # |sum of 3| <= 750, step 1/4: exact
    return (((i * 3 + rank * 5 + chunk * 11) % 101) - 50) / 2  # |sum of 3| <= 75, step 1/2: 8 bits, exact


def bf16_bits(v):
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    assert bits & 0xFFFF == 0, v  # representable in bfloat16: the upper half of the float32
    return bits >> 16


def encode(dtype, values):
    if dtype == "float32":
        return array.array("f", values).tobytes()
    return array.array("H", [bf16_bits(v) for v in values]).tobytes()


def decode(dtype, raw):
    if dtype == "float32":
        return list(array.array("f", raw))
    return [struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in array.array("H", raw)]


def rank_main(args):
    import dmagather  # the venv's: the wheel's package and its libdmagather.so

    for mod in ("numpy", "torch"):
        if importlib.util.find_spec(mod) is not None:
            print(f"rank {args.rank}: FAIL: {mod} is importable (this check runs without it)")
            return 1
    lib = dmagather.load_library()
    world, rank = args.world, args.rank
    failures, ops = 0, 0
    t0 = time.monotonic()
    with dmagather.Comm(args.job, world, rank, socket=args.socket) as comm:
        if rank == 0:
            print(f"rank 0: dmagather {dmagather.__file__} library {lib._name} {dmagather.library_version()}, "
                  f"backend {comm.backend}, reduce-scatter {dmagather.has_reduce_scatter()}")
        for dtype in ("float32", "bfloat16"):
            size = SIZES[dtype]
            for count in COUNTS:
                n = count * size
                for placement in ("out_of_place", "in_place"):
                    # --- all-gather: recv = every rank's send, rank order ---
                    recv = comm.alloc(world * n)
                    send = recv + rank * n if placement == "in_place" else comm.alloc(n)
                    ctypes.memset(recv, 0xA5, world * n)
                    mine = encode(dtype, [value(dtype, rank, 0, i) for i in range(count)])
                    ctypes.memmove(send, mine, n)
                    comm.allgather(send, recv, count=count, dtype=dtype)
                    comm.wait()
                    want = b"".join(encode(dtype, [value(dtype, r, 0, i) for i in range(count)])
                                    for r in range(world))
                    failures += report(rank, "allgather", dtype, count, placement, want,
                                       ctypes.string_at(recv, world * n))
                    ops += 1
                    if placement == "out_of_place":
                        comm.free(send)
                    comm.free(recv)
                    # --- reduce-scatter: recv = sum over ranks of chunk `rank` ---
                    send = comm.alloc(world * n)
                    recv = send + rank * n if placement == "in_place" else comm.alloc(n)
                    for c in range(world):
                        ctypes.memmove(send + c * n, encode(dtype, [value(dtype, rank, c, i) for i in range(count)]), n)
                    if placement == "out_of_place":
                        ctypes.memset(recv, 0xA5, n)
                    comm.reduce_scatter(send, recv, count=count, dtype=dtype, op=dmagather.SUM)
                    comm.wait()
                    want = encode(dtype, [sum(value(dtype, q, rank, i) for q in range(world)) for i in range(count)])
                    failures += report(rank, "reduce_scatter", dtype, count, placement, want, ctypes.string_at(recv, n))
                    ops += 1
                    if placement == "out_of_place":
                        comm.free(recv)
                    comm.free(send)
    print(f"rank {rank}: {ops} ops, {failures} failed, {time.monotonic() - t0:.2f} s")
    return 1 if failures else 0


def report(rank, op, dtype, count, placement, want, got):
    if want == got:
        return 0
    w, g = decode(dtype, want), decode(dtype, got)
    bad = [i for i in range(len(w)) if want[i * SIZES[dtype]:(i + 1) * SIZES[dtype]] !=
           got[i * SIZES[dtype]:(i + 1) * SIZES[dtype]]]
    print(f"rank {rank}: FAIL {op} {dtype} count={count} {placement}: {len(bad)} of {len(w)} elements differ, "
          f"first at {bad[0]}: got {g[bad[0]]!r} want {w[bad[0]]!r}")
    return 1


def parent_main(args):
    job = f"wheel-collectives-{os.getpid()}"
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--world", str(args.world),
                               "--socket", args.socket, "--job", job],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(args.world)]
    rcs, outs = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            out += f"(killed after {args.timeout} s)\n"
        rcs.append(p.returncode)
        outs.append(out)
    for out in outs:
        sys.stdout.write(out)
    per_rank = 2 * len(SIZES) * len(COUNTS) * 2
    if all(rc == 0 for rc in rcs) and all(f"{per_rank} ops, 0 failed" in o for o in outs):
        print(f"PASS: {args.world} ranks x {per_rank} ops (allgather, reduce_scatter SUM; float32, bfloat16; "
              f"{', '.join(map(str, COUNTS))} elements; out of place, in place): every byte as computed, "
              f"{time.monotonic() - t0:.1f} s")
        return 0
    print(f"FAIL: exit statuses {rcs}")
    return 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--rank", type=int)
    ap.add_argument("--job")
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    return rank_main(args) if args.rank is not None else parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
