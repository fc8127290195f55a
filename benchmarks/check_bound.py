"""The bounded case of `attncli check` (issue 24, item 6): time and peak memory at real-layer size.

8 heads × 2048 queries, head width 64, float32, causal + RoPE (half) + sliding window 1024 + soft-cap 50, the
expected output off by a mistake no single variant reproduces (so the search runs in full, pairs included):
`attncli check out.npy q.npy k.npy v.npy ...` in a child process, its wall time and its own peak RSS (VmHWM, read
from os.wait4). Target: <= 10 s and <= 1 GB on two cores.

    python benchmarks/check_bound.py            # with pairs (the default) and with --no-pairs
    python benchmarks/check_bound.py --quick    # 2 heads x 256 queries: checks the script, not the target
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make(folder: Path, heads: int, T: int, d: int) -> list[str]:
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, heads, T, d)).astype(np.float32) for _ in range(3))
    out = rng.normal(size=(1, heads, T, d)).astype(np.float32) * 0.01  # nothing reproduces it: the full search
    files = []
    for name, a in (("out", out), ("q", q), ("k", k), ("v", v)):
        np.save(folder / f"{name}.npy", a)
        files.append(str(folder / f"{name}.npy"))
    return files


def measure(files: list[str], extra: list[str]) -> dict[str, float]:
    args = [sys.executable, "-m", "attncli", "check", *files, "--causal", "--rope", "half", "--window", "1024",
            "--softcap", "50", "--quiet", *extra]
    t0 = time.perf_counter()
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage: ru_maxrss is its peak RSS in KiB
    wall = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    return {"exit": child.returncode, "wall_s": round(wall, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    heads, T = (2, 256) if a.quick else (8, 2048)
    with tempfile.TemporaryDirectory() as tmp:
        files = make(Path(tmp), heads, T, 64)
        rows = {"pairs": measure(files, []), "no-pairs": measure(files, ["--no-pairs"])}
    print(json.dumps({"heads": heads, "queries": T, "head_width": 64, "target": "<= 10 s, <= 1024 MB", **rows}, indent=1))


if __name__ == "__main__":
    main()
