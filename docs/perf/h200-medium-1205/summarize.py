#!/usr/bin/env python3
"""Trims a run.sh result tree (res/ from res.tgz) to the records docs/PERFORMANCE.md cites:
ab.txt (every A/B line and its arms), traces.csv (rank 0's per-op end-to-end latencies as
percentiles, and how many took over 1 ms), trainers.txt (the profiler tables and the
daemons' stop lines), suite.txt (the GPU suite's result line).

    summarize.py RES_DIR OUT_DIR
"""
import csv
import glob
import os
import re
import sys


def main(res, out):
    os.makedirs(out, exist_ok=True)
    log = open(os.path.join(res, "all.log")).read().splitlines()
    with open(os.path.join(out, "ab.txt"), "w") as f:
        f.write("\n".join(l for l in log if re.match(r"^([AB]_|A = |== part )", l)) + "\n")
    with open(os.path.join(out, "traces.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["part", "run", "ops", "p50_us", "p90_us", "p99_us", "max_us", "ops_over_1ms"])
        for path in sorted(glob.glob(os.path.join(res, "*", "trace_*.csv"))):
            us = sorted(float(r[2]) for r in csv.reader(open(path)))
            if not us:
                continue
            pct = lambda q: round(us[min(len(us) - 1, int(len(us) * q))], 1)
            w.writerow([os.path.basename(os.path.dirname(path)), os.path.basename(path)[6:-4], len(us),
                        pct(0.5), pct(0.9), pct(0.99), round(us[-1], 1), sum(u > 1000 for u in us)])
    keep = re.compile(r"PASSED|FAILED|arm  step_ms|^ +(reference|copyout|zerocopy) | x +[0-9.]+ us  |^== ")
    with open(os.path.join(out, "trainers.txt"), "w") as f:
        for path in sorted(glob.glob(os.path.join(res, "*", "*.log"))):
            name = os.path.basename(path)
            if name.startswith("daemon_") and not name.startswith("daemon_A_") and not name.startswith("daemon_B_"):
                stops = [l for l in open(path) if "cuda engine:" in l and " ops; " in l]
                f.write(f"--- {os.path.relpath(path, res)}: stop line\n" + "".join(s[s.find("cuda engine:"):] for s in stops))
            elif not name.startswith(("ab_", "daemon_", "suite")):
                lines = [l for l in open(path) if keep.search(l)]
                if lines:
                    f.write(f"--- {os.path.relpath(path, res)}\n" + "".join(lines))
    suite = os.path.join(res, "suite.log")
    if os.path.exists(suite):
        with open(os.path.join(out, "suite.txt"), "w") as f:
            f.write("".join(l for l in open(suite) if re.match(r"^(=== |\d+ passed|FAIL|PASS)", l)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
