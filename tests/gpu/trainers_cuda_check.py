"""Reads the runs of trainers_cuda.sh (OUT/NAME.rc, OUT/NAME/{losses,params}.bin,
OUT/NAME-stats.R.json, OUT/NAME-daemon.json), prints one PASS/FAIL line per
check and `N passed, N failed`; writes OUT/results.json.

    trainers_cuda_check.py OUT WORLD            the runs of `run.sh run`
    trainers_cuda_check.py OUT WORLD --restart  the runs of `run.sh restart`
    trainers_cuda_check.py OUT WORLD --rs       the runs of `run.sh rs`
"""
import json
import os
import sys

out, world = sys.argv[1], int(sys.argv[2])
restart_mode = "--restart" in sys.argv[3:]
rs_mode = "--rs" in sys.argv[3:]
results = []


def check(name, ok, detail=""):
    results.append({"check": name, "ok": bool(ok), "detail": detail})
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def rc(name):
    try:
        return int(open(os.path.join(out, f"{name}.rc")).read().strip())
    except (OSError, ValueError):
        return None


def same(a, b):
    for f in ("losses.bin", "params.bin"):
        pa, pb = os.path.join(out, a, f), os.path.join(out, b, f)
        if not (os.path.exists(pa) and os.path.exists(pb)):
            return False, f"{f} missing"
        da, db = open(pa, "rb").read(), open(pb, "rb").read()
        if not da or da != db:
            return False, f"{f} differs ({len(da)} vs {len(db)} bytes)"
    return True, "losses and params bit-identical"


def stats(name):
    s = {}
    for r in range(world):
        p = os.path.join(out, f"{name}-stats.{r}.json")
        if os.path.exists(p):
            s[r] = json.load(open(p))
    return s


def served(name, staged_ok=True):
    s = stats(name)
    if sorted(s) != list(range(world)):
        return False, f"counters of ranks {sorted(s)}"
    ops = {x["dmagather_ops"] for x in s.values()}
    fb = {r: x["fallback_by_reason"] for r, x in s.items() if x["fallback_ops"]}
    d = json.load(open(os.path.join(out, f"{name}-daemon.json")))
    job = [j for j in d.get("jobs", []) if j["job_key"] == s[0]["job_key"]]
    x = s[0]
    detail = (f"backend={x['backend']} ops={sorted(ops)} host_waited={x['host_waited_ops']} "
              f"stream_ordered={x['stream_ordered_ops']} staged={x['staged_ops']} fallbacks={fb or 0} "
              f"daemon_ops={job[0]['ops'] if job else None} daemon_errors={job[0].get('errors') if job else None}")
    ok = (len(ops) == 1 and min(ops) > 0 and not fb and x["backend"] == "cuda" and job
          and int(job[0]["ops"]) == min(ops) and not job[0].get("errors"))
    return ok, detail


def zero_copy(name):
    """(status, unshards) equal on every rank, or None."""
    seen = {(x.get("zero_copy"), x.get("zero_copy_unshards")) for x in stats(name).values()}
    return seen.pop() if len(seen) == 1 else None


def zero3_copy(name):
    """(status, fetches, fallbacks) of the ZeRO-3 zero-copy fetch, equal on every rank, or None."""
    seen = {(x.get("zero3_zero_copy"), x.get("zero3_zero_copy_fetches"),
             sum((x.get("zero3_zero_copy_fallback_by_reason") or {}).values())) for x in stats(name).values()}
    return seen.pop() if len(seen) == 1 else None


def restart_checks():
    """Each trainer through daemon restarts: ran, the same bytes as without
    dmagather, every gather served, each rank waited and came back once per
    restart under its run, and the last daemon took the job back."""
    for off, on in (("zero3-off", "zero3-restart"), ("fsdp2-off", "fsdp2-restart")):
        check(f"{off} ran", rc(off) == 0, f"rc={rc(off)}")
        check(f"{on} ran", rc(on) == 0, f"rc={rc(on)}")
        check(f"{on} == {off}", *same(off, on))
        try:
            kills = [l.split() for l in open(os.path.join(out, f"{on}.kills"))]
        except OSError:
            kills = []
        check(f"{on} daemon restarted under the run", len(kills) >= 2,
              f"{len(kills)} restarts, signal and ms until the next daemon listened: {kills}")
        try:
            log = open(os.path.join(out, f"{on}.log")).read()
        except OSError:
            log = ""
        backs = [log.count(f"rank {r}: back on dmagatherd") for r in range(world)]
        waits = [log.count(f"dmagather: rank {r}: ") - backs[r] for r in range(world)]
        check(f"{on} every rank waited and came back", all(b >= len(kills) - 1 and w == b for b, w in
                                                           zip(backs, waits)), f"back {backs}, waited {waits}")
        s = stats(on)
        fb = {r: x["fallback_by_reason"] for r, x in s.items() if x["fallback_ops"]}
        check(f"{on} served by dmagather", sorted(s) == list(range(world)) and not fb and
              all(x["dmagather_ops"] > 0 and x["backend"] == "cuda" for x in s.values()),
              f"ops {[x['dmagather_ops'] for x in s.values()]} fallbacks {fb or 0}")
        try:
            d = json.load(open(os.path.join(out, f"{on}-daemon.json")))
        except (OSError, ValueError):
            d = {}
        check(f"{on} the last daemon took the job back", int(d.get("jobs_taken_over", 0)) >= 1,
              f"jobs_taken_over={d.get('jobs_taken_over')} restarts_survived={d.get('restarts_survived')}")


def trainer_checks():
    for name in ("zero3-off", "zero3-on", "zero3-both", "zero3-flat", "fsdp2-off", "fsdp2-on", "fsdp2-copyout", "fsdp2-custom",
                 "fsdp2-off-bf16", "fsdp2-on-bf16"):
        check(f"{name} ran", rc(name) == 0, f"rc={rc(name)}")
    for name in ("zero3-off", "fsdp2-off", "fsdp2-off-bf16"):
        check(f"{name} set nothing up", stats(name) == {})
    for a, b in (("zero3-off", "zero3-on"), ("zero3-off", "zero3-both"), ("zero3-off", "zero3-flat"),
                 ("fsdp2-off", "fsdp2-on"),
                 ("fsdp2-off", "fsdp2-copyout"), ("fsdp2-off", "fsdp2-custom"), ("fsdp2-off-bf16", "fsdp2-on-bf16")):
        check(f"{b} == {a}", *same(a, b))
    for name in ("zero3-on", "zero3-both", "zero3-flat", "fsdp2-on", "fsdp2-copyout", "fsdp2-custom",
                 "fsdp2-on-bf16"):
        check(f"{name} served by dmagather", *served(name))
    for name in ("zero3-on", "zero3-both"):  # DeepSpeed's coalesced fetches gathered into the parameters
        z = zero3_copy(name)
        check(f"{name} zero-copy fetch", z is not None and z[0] == "on" and z[1] > 0 and z[2] == 0, str(z))
    z = zero3_copy("zero3-flat")
    check("zero3-flat DeepSpeed's flat-buffer fetch", z == ("off: DMAGATHER_ZERO3_ZERO_COPY=0", 0, 0), str(z))
    for name in ("fsdp2-on", "fsdp2-custom", "fsdp2-on-bf16"):  # every unshard after the set-up one (custom: all)
        z = zero_copy(name)
        check(f"{name} zero-copy unshard", z is not None and z[0] == "on" and z[1] > 0, str(z))
    z = zero_copy("fsdp2-copyout")
    check("fsdp2-copyout FSDP2's copy-out path", z == ("off: DMAGATHER_FSDP_ZERO_COPY=0", 0), str(z))
    for name in ("zero3-on", "zero3-both", "fsdp2-on", "fsdp2-on-bf16"):
        try:
            lines = [l for l in open(os.path.join(out, f"{name}.log")) if "dmagather allgather " in l and
                     ("enabled" in l or "unavailable" in l)]
        except OSError:
            lines = []
        check(f"{name} one start line", len(lines) == 1, lines[0].strip() if len(lines) == 1 else str(lines))
    # HSDP: the shard groups' own jobs (DMAGATHER_STATS_FILE's "groups"), every gather served, zero-copy.
    check("fsdp2-on-hsdp ran", rc("fsdp2-on-hsdp") == 0 and rc("fsdp2-off-hsdp") == 0)
    check("fsdp2-on-hsdp == fsdp2-off-hsdp", *same("fsdp2-off-hsdp", "fsdp2-on-hsdp"))
    groups = [g for x in stats("fsdp2-on-hsdp").values() for g in x.get("groups", [])]
    check("fsdp2-on-hsdp shard groups served", len(groups) == world and all(
        g["dmagather_ops"] > 0 and g["fallback_ops"] == 0 and g["zero_copy_unshards"] == g["dmagather_ops"] - 1
        for g in groups), str([(g.get("ranks"), g.get("dmagather_ops"), g.get("fallback_ops"), g.get("zero_copy_unshards"))
                               for g in groups]))
    # CUDA_DEVICE_MAX_CONNECTIONS=1: bit-identical, served, and (FSDP2) every
    # zero-copy unshard's done-wait left to its consumer's stream.
    for b, a in (("fsdp2-on-conn1", "fsdp2-off"), ("zero3-on-conn1", "zero3-off")):
        check(f"{b} ran", rc(b) == 0, f"rc={rc(b)}")
        check(f"{b} == {a}", *same(a, b))
        check(f"{b} served by dmagather", *served(b))
    cw = {(x.get("zero_copy_unshards"), x.get("zero_copy_consumer_waits")) for x in stats("fsdp2-on-conn1").values()}
    check("fsdp2-on-conn1 done-waits on the consumer's stream",
          len(cw) == 1 and next(iter(cw))[1] is not None and next(iter(cw))[1] > 0, str(cw))
    # Measured, not checked: rank 0's profile of the ZeRO-3 arms (zero3_train.py --profile).
    print("| arm | step ms p50 (steps 2..) | peak MiB | last step: kernels | cat kernels | kernel µs | memcpys | kernels by stream |")
    print("|---|---|---|---|---|---|---|---|")
    for name in ("zero3-off", "zero3-flat", "zero3-on"):
        try:
            pr = json.load(open(os.path.join(out, name, "profile.json")))
        except (OSError, ValueError):
            print(f"| {name} | no profile.json | | | | | | |")
            continue
        ms = sorted(pr["step_ms"][1:]) or [float("nan")]
        ls = pr["last_step"]
        cat = sum(n for k, (n, _) in ls["kernels_by_name"].items() if "CatArray" in k)
        peak = pr["peak_allocated_bytes"]
        print(f"| {name} | {ms[len(ms) // 2]:.1f} | {peak / 2**20 if peak else float('nan'):.1f} | {ls['kernels']} | {cat} "
              f"| {ls['kernel_us']:.0f} | {sum(ls['memcpy_by_kind'].values())} | {ls['kernels_by_stream']} |")


def losses(name):
    """Every rank's loss per step (losses.bin: float32, rank after rank)."""
    import array
    a = array.array("f")
    try:
        a.frombytes(open(os.path.join(out, name, "losses.bin"), "rb").read())
    except OSError:
        pass
    return list(a)


def rs_served(name):
    """Every rank served its reduce-scatters (none fell back), the same number on each."""
    s = stats(name)
    if sorted(s) != list(range(world)):
        return False, f"counters of ranks {sorted(s)}"
    # WORLD's counters or a sub-group's (HSDP: the shard group's job), whichever served them.
    groups = [max([x] + x.get("groups", []), key=lambda g: g.get("reduce_scatter_ops") or 0) for x in s.values()]
    n = {g.get("reduce_scatter_ops") for g in groups}
    fb = {r: g.get("reduce_scatter_fallback_by_reason") for r, x in s.items() for g in [x] + x.get("groups", [])
          if g.get("reduce_scatter_fallback_ops")}
    ok = len(n) == 1 and (min(n) or 0) > 0 and not fb and all(g.get("backend", x.get("backend")) == "cuda" for g, x in zip(groups, s.values()))
    return ok, f"reduce-scatters per rank {sorted(n, key=str)}, fallbacks {fb or 0}, ops by op " \
               f"{groups[0].get('reduce_scatter_ops_by_op')}"


def rs_checks():
    """The wheel's check; each trainer with the reduce-scatter: ran, served,
    the same bits on two runs, losses within 1e-3 of the run without."""
    try:
        text = open(os.path.join(out, "check.txt")).read()
    except OSError:
        text = ""
    check("dmagather.check --device cuda (the wheel's daemon)", rc("check") == 0 and "backend: cuda" in text,
          " | ".join(l for l in text.splitlines() if l.startswith(("backend", "bfloat16", "float16", "float32"))))
    for off, on in (("zero3-off", "zero3-rs"), ("fsdp2-off", "fsdp2-rs"), ("fsdp2-off-bf16", "fsdp2-rs-bf16"),
                    ("fsdp2-off-hsdp", "fsdp2-rs-hsdp")):
        for name in (off, on, on + "-again"):
            check(f"{name} ran", rc(name) == 0, f"rc={rc(name)}")
        check(f"{on} reduce-scatters served", *rs_served(on))
        check(f"{on} == {on}-again", *same(on, on + "-again"))
        a, b = losses(off), losses(on)
        worst = max((abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b)), default=float("inf"))
        check(f"{on} losses within 1e-3 of {off}", len(a) == len(b) and a and worst <= 1e-3,
              f"largest relative difference {worst:.3g} over {len(a)} losses "
              f"({'the same bits' if a == b else 'not bit-identical'})")


if restart_mode:
    restart_checks()
elif rs_mode:
    rs_checks()
else:
    trainer_checks()
json.dump(results, open(os.path.join(out, "results.json"), "w"), indent=1)
passed = sum(r["ok"] for r in results)
print(f"{passed} passed, {len(results) - passed} failed")
sys.exit(0 if passed == len(results) else 1)
