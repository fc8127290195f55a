"""attncli benchmarks for the views of issue 21 (pictures, pages and the viewer at a real layer's size),
each measured in one run, before and after where the "before" code can still be run.

    python benchmarks/views.py                # everything (about a minute on 2 cores)
    python benchmarks/views.py --only plot    # one section: plot, page, viewer (repeatable)

Every figure comes from a child process: its wall time and its own peak RSS (ru_maxrss of that
child alone, read by a small wrapper process). "before" runs the code of the commit named by
BEFORE (git show) on a size it can still finish; "after" runs today's code on the same size and
on the target size, so the ratio is measured side by side.

Targets
  plot    `attncli run X --causal --plot a.png`, T = 2048, one head: <= 3 s and <= 400 MB peak;
          32 heads at T = 512: <= 10 s.
  page    `attncli run X --html a.html`, T = 2048 × 32 heads: <= 10 s, <= 25 MB.
  viewer  `attncli view` on a 32-head, 2048-token layer: the grid's first tiles served <= 3 s after
          the URL is printed; server peak <= 1.5 GB.
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
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "0836ede"  # the commit before issue 21's views
# runs argv[1:] as a child and prints its wall time and peak RSS (kB) as JSON on the last line
WRAP = ("import json, resource, subprocess, sys, time; t = time.perf_counter(); "
        "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE); "
        "print(json.dumps({'s': time.perf_counter() - t, 'rss_kb': "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, 'rc': r.returncode, "
        "'err': r.stderr.decode()[-300:]}))")


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def measure(cmd: list[str], timeout: float = 900) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", WRAP, *cmd], capture_output=True, text=True, env=env(),
                         timeout=timeout)
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if res["rc"] != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}: {res['err']}")
    return res


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "attncli", *args]


def old_module(tmp: Path, path: str, name: str) -> Path:
    """The file ``path`` as it was at BEFORE, saved as ``tmp/name.py``."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:{path}"], capture_output=True, text=True,
                          check=True).stdout
    (tmp / f"{name}.py").write_text(text)
    return tmp


ROWS: list[tuple[str, str, str, str]] = []


def row(what: str, figure: str, limit: str, ok: bool | None) -> None:
    ROWS.append((what, figure, limit, "" if ok is None else ("ok" if ok else "MISSED")))
    print(f"  {what:<58} {figure:>20}  {limit:<16} {ROWS[-1][3]}", flush=True)


def plot_section(tmp: Path) -> None:
    print("plot")
    rng = np.random.default_rng(0)
    x128, x2048, h32 = tmp / "x128.npy", tmp / "x2048.npy", tmp / "h32.npy"
    np.save(x128, rng.standard_normal((128, 16)).astype(np.float32))
    np.save(x2048, rng.standard_normal((2048, 16)).astype(np.float32))
    np.save(h32, rng.standard_normal((1, 32, 512, 16)).astype(np.float32))
    old_module(tmp, "attncli/render/plot.py", "plot_before")
    before = ("import sys; sys.path.insert(0, sys.argv[1]); import numpy as np, attncli, plot_before as p; "
              "t = attncli.attend(np.load(sys.argv[2]), causal=True); "
              "p.plot_steps(t, open(sys.argv[3], 'wb'), 'png', p.PlotOptions())")
    after = before.replace("plot_before as p", "attncli.render.plot as p")
    b = measure([sys.executable, "-c", before, str(tmp), str(x128), str(tmp / "b128.png")])
    a = measure([sys.executable, "-c", after, str(tmp), str(x128), str(tmp / "a128.png")])
    row("T = 128 causal, one head: before (per-cell hatched patches)", f"{b['s']:.2f} s", "", None)
    row("T = 128 causal, one head: after (one image)", f"{a['s']:.2f} s", f"{b['s'] / a['s']:.0f}x faster", None)
    r = measure(cli("run", str(x2048), "--causal", "-q", "--plot", str(tmp / "a2048.png")))
    row("attncli run, T = 2048 causal, one head, --plot", f"{r['s']:.2f} s", "<= 3 s", r["s"] <= 3)
    row("  peak RSS", f"{r['rss_kb'] / 1024:.0f} MB", "<= 400 MB", r["rss_kb"] / 1024 <= 400)
    r = measure(cli("run", str(h32), "-q", "--plot", str(tmp / "h32.png")))
    row("attncli run, 32 heads, T = 512, --plot", f"{r['s']:.2f} s", "<= 10 s", r["s"] <= 10)
    row("  peak RSS", f"{r['rss_kb'] / 1024:.0f} MB", "", None)


SECTIONS = {"plot": plot_section}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=sorted(SECTIONS))
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        for name in args.only or list(SECTIONS):
            SECTIONS[name](Path(d))
    print(f"load average after: {os.getloadavg()[0]:.2f}; {time.perf_counter() - start:.0f} s in all")
    if any(r[3] == "MISSED" for r in ROWS):
        sys.exit(1)


if __name__ == "__main__":
    main()
