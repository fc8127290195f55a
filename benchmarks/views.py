"""attncli benchmarks for the views of issue 21 (pictures, pages and the viewer at a real layer's size),
each measured in one run, before and after where the "before" code can still be run.

    python benchmarks/views.py                # everything but the grid (about a minute on 2 cores)
    python benchmarks/views.py --only plot    # one section: plot, page, viewer, grid (repeatable)
    python benchmarks/views.py --only grid    # issue 32's grid at T = 2048 × 32 query heads (~30 min on 2 cores)
    python benchmarks/views.py --only grid --reduced --before 55fbf7f   # the "before" of a reduced grid

The grid: grouped-query (8 K/V heads) or not × causal or not × --explain-row or not × float32/float64 ×
batch 1/2, each cell `attncli run Q K V -q --html`, `attncli check OUT Q K V -q` of the output `run --save`
wrote (the same options; --mismatch: --causal flipped, so the catalogue is searched), and (--explain-row aside)
`--plot` and `attncli view`'s first paint, with its wall time, CPU time (user + system: what a busy machine does not inflate), the
child's peak memory (VmHWM) and the file's size. --before REV runs the code of commit REV (git archive)
under a memory cap (GRID_CAP), so a "before" that grows without bound is stopped and said so.

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
  grid    every cell: --html <= 10 s per batch entry, <= 1.5 GB, <= 25 MB; --plot <= 3 s per panel,
          <= 400 MB; the viewer's first paint <= 3 s; check <= 1.5 GB (a match: exit 0).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
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
WRAP = ("import json, os, resource, subprocess, sys, time; t = time.perf_counter(); cap = int(os.environ.get('CAP', 0)); "
        "lim = (lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap))) if cap else None; "
        "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=lim); "
        "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
        "print(json.dumps({'s': time.perf_counter() - t, 'rss_kb': u.ru_maxrss, 'cpu': u.ru_utime + u.ru_stime, "
        "'rc': r.returncode, 'err': r.stderr.decode()[-300:]}))")
GRID_T, GRID_H, GRID_KV, GRID_D = 2048, 32, 8, 64
GRID_CAP = 6 << 30  # address space of one child of the grid (a "before" that grows past it is stopped)


def env() -> dict[str, str]:
    # PYTHONSAFEPATH: `python -m attncli` would otherwise import the attncli of the working directory (this tree)
    # ahead of PYTHONPATH, so a --before run from the repository root measured today's code
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONSAFEPATH": "1"}


def measure(cmd: list[str], timeout: float = 900, cap: int = 0, root: Path = ROOT,
            check: bool = True) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", WRAP, *cmd], capture_output=True, text=True,
                         env={**env(), "PYTHONPATH": str(root), "CAP": str(cap)}, timeout=timeout)
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if res["rc"] != 0 and check:
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
              "M = type('M', (dict,), {'__getattr__': lambda s, k: s.get(k)}); "  # the old module read meta as a dict
              "t.meta = M(t.meta.to_dict()) if 'plot_before' in p.__name__ else t.meta; "
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


def page_section(tmp: Path) -> None:
    print("page")
    rng = np.random.default_rng(0)
    x512, x2048 = tmp / "p128.npy", tmp / "p2048.npy"
    np.save(x512, rng.standard_normal((1, 32, 128, 8)).astype(np.float32))
    np.save(x2048, rng.standard_normal((1, 32, 2048, 64)).astype(np.float32))
    old_module(tmp, "attncli/render/page.py", "page_before")
    before = ("import sys; sys.path.insert(0, sys.argv[1]); import numpy as np, attncli, page_before as p; "
              "from attncli.core.diagnostics import attach; t = attncli.attend(np.load(sys.argv[2]), causal=True); "
              "attach(t); M = type('M', (dict,), {'__getattr__': lambda s, k: s.get(k)}); t.meta = M(t.meta.to_dict()); "
              "open(sys.argv[3], 'w').write(p.page(t))")  # the old module read meta as a dict
    try:
        b: dict[str, Any] | None = measure([sys.executable, "-c", before, str(tmp), str(x512), str(tmp / "b128.html")])
    except SystemExit:  # the old page module calls explanations that have moved on with the typed Trace
        b = None
        row("T = 128 × 32 heads: before", "n/a", "the old page no longer runs on today's Trace", None)
    if b is not None:
        size = (tmp / "b128.html").stat().st_size
        row("T = 128 × 32 heads: before (tables of the first 64 × 64 of 16 heads)", f"{b['s']:.2f} s", "", None)
        row("  its peak RSS and size", f"{b['rss_kb'] / 1024:.0f} MB, {size / 1e6:.1f} MB", "", None)
    a = measure(cli("run", str(x512), "--causal", "-q", "--html", str(tmp / "a128.html")))
    size = (tmp / "a128.html").stat().st_size
    row("T = 128 × 32 heads: after (every head, first/last rows exact)", f"{a['s']:.2f} s",
        f"{b['s'] / a['s']:.1f}x faster" if b is not None else "", None)
    row("  its peak RSS and size", f"{a['rss_kb'] / 1024:.0f} MB, {size / 1e6:.1f} MB", "", None)
    r = measure(cli("run", str(x2048), "--causal", "-q", "--html", str(tmp / "a2048.html")))
    size = (tmp / "a2048.html").stat().st_size
    row("attncli run, T = 2048 × 32 heads, --html", f"{r['s']:.2f} s", "<= 10 s", r["s"] <= 10)
    row("  file size", f"{size / 1e6:.1f} MB", "<= 25 MB", size <= 25e6)
    row("  peak RSS", f"{r['rss_kb'] / 1024:.0f} MB", "", None)
    opened = open_in_chromium(tmp / "a2048.html")
    if opened is not None:
        row("  opens in chromium (load event)", f"{opened:.2f} s", "<= 3 s", opened <= 3)


def open_in_chromium(path: Path) -> float | None:
    import shutil

    exe = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if exe is None:
        return None
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        page = b.new_page()
        t = time.perf_counter()
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        took = time.perf_counter() - t
        b.close()
    return took


def viewer_section(tmp: Path) -> None:
    import signal
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    print("viewer")
    x = tmp / "h32x2048.npy"
    np.save(x, np.random.default_rng(0).standard_normal((1, 32, 2048, 64)).astype(np.float32))
    proc = subprocess.Popen(cli("view", str(x), "--causal", "--no-open"), stdout=subprocess.PIPE, text=True, env=env())
    assert proc.stdout is not None
    url = proc.stdout.readline().split(": ", 1)[1].strip()
    t0 = time.perf_counter()
    base, token = url.split("/?token=")

    def get(path: str) -> bytes:
        with urllib.request.urlopen(f"{base}{path}&token={token}", timeout=600) as r:
            return bytes(r.read())

    try:
        get("/api/meta?")
        tiles = [f"/api/tile?layer=0&entry=0,{h}&step=weights&r0=0&r1=2048&c0=0&c1=2048&w=160&h=160" for h in range(32)]
        with ThreadPoolExecutor(6) as ex:  # as a browser: 6 connections to one host
            list(ex.map(get, tiles))
        first = time.perf_counter() - t0
        t1 = time.perf_counter()
        get("/api/tile?layer=0&entry=0,5&step=weights&r0=1000&r1=1040&c0=900&c1=940&w=640&h=640")
        zoom = time.perf_counter() - t1
        t1 = time.perf_counter()
        get("/api/explain?layer=0&entry=0,5&i=1020&j=910")
        explain = time.perf_counter() - t1
        t1 = time.perf_counter()
        get("/api/tile?layer=0&entry=0,5&step=scores&r0=0&r1=2048&c0=0&c1=2048&w=160&h=160")
        step = time.perf_counter() - t1
        peak = int(next(line.split()[1] for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                        if line.startswith("VmHWM")))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    row("view, 32 heads × 2048 tokens (d = 64): first paint (32 tiles)", f"{first:.2f} s", "<= 3 s", first <= 3)
    row("  a zoomed-in tile (exact rows)", f"{zoom:.2f} s", "", None)
    row("  a cell's arithmetic", f"{explain:.2f} s", "", None)
    row("  another step's overview (scores, every row)", f"{step:.2f} s", "", None)
    row("  server peak RSS", f"{peak / 1024:.0f} MB", "<= 1536 MB", peak / 1024 <= 1536)


def first_paint(cmd: list[str], root: Path, heads: int, batch: int, cap: int = 0) -> tuple[float, int] | str:
    """`attncli view ...`: seconds from the printed URL to every entry's first tile, and the server's VmHWM
    (kB); or why it did not serve."""
    import signal
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    def limit() -> None:
        if cap:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env(), "PYTHONPATH": str(root)}, preexec_fn=limit)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if ": " not in line:
        proc.kill()
        return "did not start: " + (proc.stderr.read() if proc.stderr else "")[-200:]
    url = line.split(": ", 1)[1].strip()
    t0 = time.perf_counter()
    base, token = url.split("/?token=")

    def get(path: str) -> bytes:
        with urllib.request.urlopen(f"{base}{path}&token={token}", timeout=600) as r:
            return bytes(r.read())

    try:
        get("/api/meta?")
        entries = [f"{b},{h}" for b in range(batch) for h in range(heads)]
        tiles = [f"/api/tile?layer=0&entry={e}&step=weights&r0=0&r1={GRID_T}&c0=0&c1={GRID_T}&w=160&h=160"
                 for e in entries]
        with ThreadPoolExecutor(6) as ex:  # as a browser: 6 connections to one host
            list(ex.map(get, tiles))
        took = time.perf_counter() - t0
        peak = int(next(x.split()[1] for x in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                        if x.startswith("VmHWM")))
    except Exception as e:  # noqa: BLE001 (a "before" that ran out of memory: said in the table)
        return f"failed: {type(e).__name__}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return took, peak


def code_of(rev: str | None, tmp: Path) -> Path:
    """The tree whose attncli runs: this one, or commit ``rev``'s attncli/ (git archive) under tmp."""
    if rev is None:
        return ROOT
    dest = tmp / f"at-{rev}"
    if not dest.exists():
        dest.mkdir()
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "attncli"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    return dest


GRID: list[dict[str, Any]] = []


def grid_section(tmp: Path, before: str | None = None, reduced: bool = False, cells: str | None = None,
                 check_rows: bool = True, mismatch: bool = False, what: str = "html,check,plot,view") -> None:
    """Issue 32's grid: every cell's --html, --plot, viewer and check, measured one after the other."""
    import itertools

    root = code_of(before, tmp)
    label = f"before ({before})" if before else "after"
    print(f"grid, {label}: T = {GRID_T}, {GRID_H} query heads, d = {GRID_D}"
          + (" (reduced: float32, batch 1, causal)" if reduced else ""))
    rng = np.random.default_rng(0)
    files: dict[tuple[int, str, int], Path] = {}

    def array(batch: int, dtype: str, heads: int) -> Path:
        key = (batch, dtype, heads)
        if key not in files:
            files[key] = tmp / f"g{batch}{dtype}{heads}.npy"
            np.save(files[key], rng.standard_normal((batch, heads, GRID_T, GRID_D)).astype(dtype))
        return files[key]

    dims = list(itertools.product([False, True], [True] if reduced else [False, True], [False, True],
                                  ["float32"] if reduced else ["float32", "float64"], [1] if reduced else [1, 2]))
    print(f"  {'cell':<44} {'what':<6} {'wall s':>8} {'cpu s':>7} {'peak MB':>8} {'size MB':>8}  verdict")
    for gqa, causal, row, dtype, batch in dims:
        q = array(batch, dtype, GRID_H)
        kv = array(batch, dtype, GRID_KV) if gqa else q
        args = [str(q), str(kv), str(kv)] + (["--causal"] if causal else [])
        name = (f"{'GQA 32/8' if gqa else 'MHA 32'} {'causal' if causal else 'full'} {dtype} B={batch}"
                + (" --explain-row 777" if row else ""))
        if cells is not None and not re.search(cells, name):
            continue
        out = tmp / "g.html"
        explain = ["--explain-row", f"0,5:{min(777, GRID_T - 1)}"] if row else []  # batch 0, head 5
        if "html" in what:
            r = measure(cli("run", *args, "-q", *explain, "--html", str(out)), cap=GRID_CAP, root=root, check=False,
                        timeout=1800)
            report(name, "html", r, out, 10 * batch, 1536, 25, gqa=gqa, causal=causal, row=row, dtype=dtype,
                   batch=batch, before=before)
        if check_rows and not row and "check" in what:  # (the same output and options as the cell without --explain-row)
            check_cell(name, args, tmp, root, before, mismatch, gqa=gqa, causal=causal, row=row, dtype=dtype,
                       batch=batch)
        if row:
            continue
        out = tmp / "g.png"
        if "plot" in what:
            r = measure(cli("run", *args, "-q", "--plot", str(out)), cap=GRID_CAP, root=root, check=False,
                        timeout=1800)
            report(name, "plot", r, out, 3 * GRID_H * batch, 400, None, gqa=gqa, causal=causal, row=row, dtype=dtype,
                   batch=batch, before=before)
        if "view" not in what:
            continue
        v = first_paint(cli("view", *args, "--no-open"), root, GRID_H, batch, cap=GRID_CAP)
        if isinstance(v, str):
            print(f"  {name:<44} {'view':<6} {v}", flush=True)
            GRID.append({"cell": name, "what": "view", "error": v, "before": before})
        else:
            ok = v[0] <= 3 and v[1] / 1024 <= 1536
            print(f"  {name:<44} {'view':<6} {v[0]:>8.2f} {'':>7} {v[1] / 1024:>8.0f} {'':>8}  "
                  f"{'ok' if ok else 'MISSED'}", flush=True)
            GRID.append({"cell": name, "what": "view", "s": v[0], "peak_mb": v[1] / 1024, "ok": ok, "before": before})


def check_cell(name: str, args: list[str], tmp: Path, root: Path, before: str | None, mismatch: bool,
               **cell: Any) -> None:
    """The grid's `check` row: `attncli check OUT.npy ARGS -q` of the output `attncli run ARGS --save OUT.npy` saved
    (the same options: a match, exit 0); with ``mismatch``, the output of the problem with --causal flipped, checked
    with the cell's options (a mismatch, exit 1, the catalogue searched: it must name causal-missing/-added)."""
    saved = tmp / "g_out.npy"
    flipped = [a for a in args if a != "--causal"] if "--causal" in args else [*args, "--causal"]
    made = measure(cli("run", *(flipped if mismatch else args), "-q", "--save", str(saved)), cap=GRID_CAP, root=root,
                   check=False, timeout=1800)
    if made["rc"] != 0:
        report(name, "check", made, tmp / "none", math.inf, 1536, None, before=before, **cell)
        return
    r = measure(cli("check", str(saved), *args, "-q"), cap=GRID_CAP, root=root, check=False, timeout=1800)
    if mismatch and r["rc"] == 1:
        r = {**r, "rc": 0}  # the mismatch expected; whether it is named is `attncli check` without -q's business
    report(name, "check!" if mismatch else "check", r, tmp / "none", math.inf, 1536, None, before=before, **cell)
    saved.unlink(missing_ok=True)


def report(name: str, what: str, r: dict[str, Any], out: Path, seconds: float, mb: float, size_mb: float | None,
           **cell: Any) -> None:
    size = out.stat().st_size / 1e6 if r["rc"] == 0 and out.exists() else None
    peak = r["rss_kb"] / 1024
    if r["rc"] != 0:
        verdict = f"FAILED (exit {r['rc']}): {r['err'].strip().splitlines()[-1][:80] if r['err'].strip() else ''}"
    else:
        ok = r["s"] <= seconds and peak <= mb and (size_mb is None or (size or 0) <= size_mb)
        verdict = "ok" if ok else "MISSED"
    if out.exists():
        out.unlink()
    print(f"  {name:<44} {what:<6} {r['s']:>8.2f} {r['cpu']:>7.2f} {peak:>8.0f} "
          f"{'' if size is None else f'{size:.2f}':>8}  {verdict}", flush=True)
    GRID.append({"cell": name, "what": what, "s": r["s"], "cpu": r["cpu"], "peak_mb": peak, "size_mb": size,
                 "rc": r["rc"], "verdict": verdict, **cell})
    ROWS.append((f"{name} {what}", f"{r['s']:.1f} s", "", "MISSED" if verdict != "ok" and not cell.get("before")
                 else ""))


SECTIONS = {"plot": plot_section, "page": page_section, "viewer": viewer_section, "grid": grid_section}


def main() -> None:
    global GRID_T
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=sorted(SECTIONS))
    ap.add_argument("--before", metavar="REV", help="grid: run the code of commit REV (the 'before')")
    ap.add_argument("--reduced", action="store_true", help="grid: float32, batch 1, causal only")
    ap.add_argument("--json", metavar="PATH", help="grid: write every cell's figures there")
    ap.add_argument("--cells", metavar="REGEX", help="grid: only the cells whose name matches, e.g. 'GQA.*float32 B=1'")
    ap.add_argument("--tokens", type=int, default=2048, help="grid: T (2048; smaller only to try the script)")
    ap.add_argument("--no-check", action="store_true", help="grid: leave out the check rows")
    ap.add_argument("--what", default="html,check,plot,view", help="grid: which rows of each cell (default: all)")
    ap.add_argument("--mismatch", action="store_true",
                    help="grid: the check rows check an output computed with --causal flipped (the catalogue searched)")
    args = ap.parse_args()
    GRID_T = args.tokens
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        for name in args.only or [s for s in SECTIONS if s != "grid"]:
            if name == "grid":
                grid_section(Path(d), args.before, args.reduced, args.cells, not args.no_check, args.mismatch,
                             args.what)
            else:
                SECTIONS[name](Path(d))
    if args.json and GRID:
        Path(args.json).write_text(json.dumps({"load": os.getloadavg(), "cells": GRID}, indent=1))
    print(f"load average after: {os.getloadavg()[0]:.2f}; {time.perf_counter() - start:.0f} s in all")
    if any(r[3] == "MISSED" for r in ROWS):
        sys.exit(1)


if __name__ == "__main__":
    main()
