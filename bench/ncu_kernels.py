#!/usr/bin/env python3
"""Per-kernel totals from an ncu CSV: where a window of a training step goes.

    ncu --csv --page raw --metrics gpu__time_duration.sum --launch-skip S --launch-count C \
        mxswitch train ... > ncu.csv
    python3 bench/ncu_kernels.py ncu.csv [--top 30]

Kernels are grouped by name (template arguments and parameters cut off);
each row gives calls, total and mean duration and the share of the window.
ncu serializes kernels, so the window's sum is device time without overlap.
"""
import argparse
import csv
import io
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"\(.*", "", name)  # parameters
    name = re.sub(r"<.*>", "", name)  # template arguments
    return name.replace("void ", "").strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    text = open(a.csv, errors="replace").read()
    # ncu prints its own log lines (==PROF== ...) and the program's output
    # before the CSV; the table starts at the header row.
    start = text.find('"ID","Process ID"')
    if start < 0:
        sys.exit(f"{a.csv}: no ncu CSV header found")
    rows = list(csv.reader(io.StringIO(text[start:])))
    head = rows[0]
    name_i, dur_i = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    unit = rows[1][dur_i] if len(rows) > 1 else ""
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit)
    if scale is None:
        sys.exit(f"{a.csv}: unexpected duration unit {unit!r}")
    tot = defaultdict(lambda: [0, 0.0])
    for r in rows[2:]:
        if len(r) <= max(name_i, dur_i) or not r[dur_i]:
            continue
        t = tot[short(r[name_i])]
        t[0] += 1
        t[1] += float(r[dur_i].replace(",", "")) * scale
    total = sum(v[1] for v in tot.values())
    n = sum(v[0] for v in tot.values())
    print(f"{n} kernels, {total / 1e3:.2f} ms of device time")
    for k, (c, us) in sorted(tot.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"  {k[:60]:60} {c:6} calls {us / 1e3:9.3f} ms {100 * us / total:5.1f}%  {us / c:9.1f} us/call")


if __name__ == "__main__":
    main()
