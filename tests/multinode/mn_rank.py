"""One rank of a multi-node test job (run by multinode_test.py, usually inside
a node's network namespace). Prints one line: "RESULT <json>".

  mn_rank.py SOCKET JOB_ID JOB_KEY WORLD RANK SCENARIO [ARG]

Scenarios:
  matrix     every dtype x sizes x (flat out of place, flat in place, list,
             coalesced), each op checked bit-exact against the expected bytes.
  loop       64 MiB AllGathers until one fails (or ARG seconds pass); reports
             the first error, its message and the ops completed.
  disagree   rank 1 asks for a different count: expects INVALID_ARGUMENT on
             every rank, then a correct op.
  fallback   the last rank refuses: expects FALLBACK with its reason on every
             rank, then a correct op.
  verify     ARG AllGathers of 1 MiB per rank, each op's inputs new, each
             output checked bit-exact; until one fails. Reports ops, bad
             outputs, the first error and the longest op.
  join       joins only (for join failures): reports the status.
"""
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.environ["DMAGATHER_PY"])
import dmagather  # noqa: E402

DTYPES = ["uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def pattern(rank, count, dtype, salt):
    """Deterministic bytes for (rank, salt): every bit pattern, NaNs included, compared as bytes."""
    width = np.dtype("uint16" if dtype == "bfloat16" else dtype).itemsize
    rng = np.random.default_rng((rank + 1) * 1000003 + salt)
    return rng.integers(0, 256, size=count * width, dtype=np.uint8)


def as_bytes(a):
    return a.view(np.uint8)


def matrix(c, world, rank):
    checked = 0
    sizes = [1, 3, 4095, (1 << 20) + 7]
    salt = 0
    for dtype in DTYPES:
        for count in sizes:
            if dtype not in ("uint8", "float32") and count > 4095:
                continue  # Large sizes for two dtypes keep the run short.
            salt += 1
            send = c.empty(count, dtype)
            as_bytes(send)[:] = pattern(rank, count, dtype, salt)
            expect = np.concatenate([pattern(r, count, dtype, salt) for r in range(world)])
            # Flat, out of place.
            recv = c.empty(count * world, dtype)
            as_bytes(recv)[:] = 0xAB
            c.allgather(send, recv, count, dtype)
            c.wait()
            assert np.array_equal(as_bytes(recv), expect), f"flat {dtype} x{count}"
            # Flat, in place (send is this rank's slot of recv).
            recv2 = c.empty(count * world, dtype)
            as_bytes(recv2)[:] = 0xCD
            width = send.itemsize
            as_bytes(recv2)[rank * count * width:(rank + 1) * count * width] = pattern(rank, count, dtype, salt)
            c.allgather(recv2[rank * count:(rank + 1) * count], recv2, count, dtype)
            c.wait()
            assert np.array_equal(as_bytes(recv2), expect), f"in place {dtype} x{count}"
            # List output.
            outs = [c.empty(count, dtype) for _ in range(world)]
            c.allgather_list(send, outs, count, dtype)
            c.wait()
            for r in range(world):
                assert np.array_equal(as_bytes(outs[r]), pattern(r, count, dtype, salt)), f"list {dtype} x{count} r{r}"
            for b in [send, recv, recv2] + outs:
                c.free(b)
            checked += 3
    # Coalesced: three items of different dtypes and odd counts in one op.
    items, expects = [], []
    for i, (dtype, count) in enumerate([("float32", 1001), ("int8", 7), ("bfloat16", 65537)]):
        send = c.empty(count, dtype)
        as_bytes(send)[:] = pattern(rank, count, dtype, 900 + i)
        recv = c.empty(count * world, dtype)
        items.append((send, recv, count, dtype))
        expects.append(np.concatenate([pattern(r, count, dtype, 900 + i) for r in range(world)]))
    c.allgather_coalesced(items).wait()
    for (send, recv, _, _), e in zip(items, expects):
        assert np.array_equal(as_bytes(recv), e), "coalesced"
    checked += 1
    return {"checked": checked}


def loop(c, world, rank, seconds):
    count = 16 << 20  # 64 MiB of float32 per rank.
    send = c.empty(count, "float32")
    recv = c.empty(count * world, "float32")
    send[:] = rank
    ops = 0
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        try:
            c.allgather_async(send, recv, count, "float32").wait()
        except dmagather.DmagatherError as e:
            return {"ops": ops, "code": e.code, "message": e.message, "failed_at": time.time()}
        ops += 1
        if ops == 1:
            print("FIRST_OP_DONE", flush=True)
    return {"ops": ops, "code": 0}


def verify(c, world, rank, n_ops):
    count = 1 << 18  # float32: 1 MiB per rank.
    send = c.empty(count, "float32")
    recv = c.empty(count * world, "float32")
    base = np.arange(count, dtype=np.float32)
    bad, longest = 0, 0.0
    for i in range(n_ops):
        send[:] = base + (rank * 1000003 + i)  # Differs per rank and per op.
        recv[:] = -1
        t = time.monotonic()
        try:
            c.allgather_async(send, recv, count, "float32").wait()
        except dmagather.DmagatherError as e:
            return {"ops": i, "bad": bad, "code": e.code, "message": e.message, "failed_at": time.time(),
                    "max_wait_s": longest}
        longest = max(longest, time.monotonic() - t)
        for r in range(world):
            if not np.array_equal(recv[r * count:(r + 1) * count], base + (r * 1000003 + i)):
                bad += 1
        if i == 0:
            print("FIRST_OP_DONE", flush=True)
    return {"ops": n_ops, "bad": bad, "code": 0, "max_wait_s": longest}


def expect_all_fail(c, world, rank, bad_count, refuse):
    count = 1000
    send = c.empty(count, "int32")
    recv = c.empty(count * world, "int32")
    send[:] = rank
    try:
        if refuse:
            c.submit_fallback(f"rank {rank} has no such tensor").wait()
        else:
            c.allgather_async(send, recv, bad_count if rank == 1 else count, "int32").wait()
        first = {"code": 0, "message": ""}
    except dmagather.DmagatherError as e:
        first = {"code": e.code, "message": e.message}
    # The job goes on: the next op is correct everywhere.
    send[:] = rank * 7
    c.allgather_async(send, recv, count, "int32").wait()
    ok = bool(np.array_equal(recv, np.repeat(np.arange(world, dtype=np.int32) * 7, count)))
    return {"first": first, "next_ok": ok}


def main():
    sock, job_id, key, world, rank, scenario = sys.argv[1:7]
    arg = sys.argv[7] if len(sys.argv) > 7 else None
    world, rank = int(world), int(rank)
    t0 = time.monotonic()
    try:
        c = dmagather.Comm(key, world, rank, socket=sock, lib=os.environ["DMAGATHER_LIB"], job_id=job_id,
                           join_timeout_ms=int(os.environ.get("MN_JOIN_TIMEOUT_MS", "30000")))
    except dmagather.DmagatherError as e:
        print("RESULT " + json.dumps({"join": e.code, "message": e.message, "join_s": time.monotonic() - t0}),
              flush=True)
        return
    res = {"join": 0}
    if scenario == "matrix":
        res.update(matrix(c, world, rank))
    elif scenario == "loop":
        res.update(loop(c, world, rank, float(arg or 30)))
    elif scenario == "verify":
        res.update(verify(c, world, rank, int(arg)))
    elif scenario == "disagree":
        res.update(expect_all_fail(c, world, rank, bad_count=999, refuse=False))
    elif scenario == "fallback":
        res.update(expect_all_fail(c, world, rank, bad_count=None, refuse=rank == world - 1))
    try:
        c.close()
    except dmagather.DmagatherError as e:  # The job (or the daemon) failed: close() says so too.
        res["close"] = e.code
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
