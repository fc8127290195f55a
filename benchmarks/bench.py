"""attncli benchmarks: the targets of issue 7, each measured side by side in one run.

    python benchmarks/bench.py                 # everything (a few minutes on 2 cores)
    python benchmarks/bench.py --quick         # smaller sizes, to check the script itself
    python benchmarks/bench.py --only compute  # one section: compute, startup, memory, render

Prints a table of ratios (each against a reference measured in the same run, so a loaded
machine slows both sides) and writes every number to benchmarks/results.json (--json PATH).

Targets
  1. compute  float32, d = 64, self-attention, output only: attncli.attend (numpy) at most
              1.0x torch SDPA on the CPU, and within 3x of the matmul floor 4·T²·d / sgemm rate.
  2. startup  `attncli run` on a bundled 4x4 example and `attncli --help`: median wall at most
              0.3 s, and at least 5x faster than `python -c "import torch"`; `attncli --help` at most 2x
              `import typer, rich` and `attncli run` at most 2x `import numpy, typer, rich, yaml`, side
              by side (issue 30).
  3. memory   T = 32768, d = 64, float32, output only (`attncli run x.npy --save out.npy`):
              peak RSS at most 600 MB; T = 65536 completes.
  4. render   the default view of a T = 4096 run: under 1 s more than the same run with --quiet.
  5. modern   T = 8192, d = 64, float32, output only, 4 query heads: grouped-query (2 K/V heads) +
              RoPE + sliding window (4096) within 1.5x of plain scaled-dot on the same Q, K, V
              sizes (4 K/V heads, no position stage, no mask), measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "attncli" / "examples" / "cat_milk_sweet.yaml"
D = 64


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor()
    import torch

    return {
        "cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
        "numpy": np.__version__, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "env": {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                           "MKL_NUM_THREADS") if k in os.environ},
        "load_average_start": list(os.getloadavg()),
    }


def _time(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each function: ``repeats`` turns each, the functions taking turns so that
    load hits them alike. A turn is several calls back to back (about 0.2 s), timed together: it
    measures the steady state. Each turn starts after a pause and one untimed call: OpenBLAS and
    OpenMP threads spin for a while after a call (and sleep after that), and without the pause
    the function that runs right after another library would share the cores with its threads."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    inner: dict[str, int] = {}
    for name, fn in fns.items():  # warm-up (imports, thread pools, first-touch of memory), and the turn length
        fn()
        inner[name] = max(1, min(50, int(0.2 / max(_time(fn), 1e-6))))
    for _ in range(repeats):
        for name, fn in fns.items():
            # a pause, so that the threads the previous function left spinning (OpenBLAS's for ~0.1 s
            # after a call) are asleep, then one call untimed: each turn starts from the same state
            time.sleep(SETTLE_S)
            fn()
            t = time.perf_counter()
            for _ in range(inner[name]):
                fn()
            times[name].append((time.perf_counter() - t) / inner[name])
    return times


SETTLE_S = 0.25  # pause before each turn: longer than OpenBLAS's threads spin after a call
SGEMM_N = 2048  # square float32 product whose best time gives the sgemm rate (1024² reads low on 2 cores)


# ---- 1. compute ------------------------------------------------------------------------


def bench_compute(sizes: list[int]) -> dict[str, Any]:
    import torch

    from attncli import attend

    rows = []
    for t in sizes:
        x = np.random.default_rng(t).standard_normal((t, D)).astype(np.float32)
        t3 = torch.from_numpy(x)[None]  # (1, T, d): SDPA's math kernel, as the reference figures
        t4 = t3[None]  # (1, 1, T, d): 4-D, so SDPA runs its fused flash kernel
        a = np.random.default_rng(0).standard_normal((SGEMM_N, SGEMM_N)).astype(np.float32)
        fns = {
            "sgemm": lambda a=a: a @ a,  # the matmul rate, taken in turn with the others
            "attncli_numpy": lambda x=x: attend(x, keep_weights=False),
            "torch_sdpa": lambda t=t3: torch.nn.functional.scaled_dot_product_attention(t, t, t),
            "torch_sdpa_flash": lambda t=t4: torch.nn.functional.scaled_dot_product_attention(t, t, t),
            "attncli_torch": lambda x=x: attend(x, keep_weights=False, backend="torch"),
        }
        if torch.cuda.is_available():  # on a GPU: the torch backend on CUDA against SDPA there, side by side
            xc = torch.from_numpy(x).cuda()[None, None]  # (1, 1, T, d)

            def synced(fn: Callable[[], Any]) -> Callable[[], Any]:
                return lambda: (fn(), torch.cuda.synchronize())

            fns["cuda_sdpa"] = synced(lambda t=xc: torch.nn.functional.scaled_dot_product_attention(t, t, t))
            fns["attncli_cuda"] = synced(lambda x=x: attend(x, keep_weights=False, backend="torch", device="cuda"))
        # best-of turns (load only adds time); more at T = 1024, whose few milliseconds a busy machine blurs
        times = interleaved(fns, repeats={1024: 15, 4096: 7}.get(t, 5))
        best = {k: min(v) for k, v in times.items()}
        rate = 2 * SGEMM_N**3 / best.pop("sgemm")
        rows.append({"T": t, "seconds_best": best, "seconds_all": times, "sgemm_gflops": rate / 1e9,
                     "numpy_vs_sdpa": best["attncli_numpy"] / best["torch_sdpa"],
                     "numpy_vs_sdpa_flash": best["attncli_numpy"] / best["torch_sdpa_flash"],
                     "torch_backend_vs_sdpa_flash": best["attncli_torch"] / best["torch_sdpa_flash"],
                     "torch_backend_vs_sdpa": best["attncli_torch"] / best["torch_sdpa"],
                     **({"cuda_vs_sdpa_cuda": best["attncli_cuda"] / best["cuda_sdpa"]} if "cuda_sdpa" in best else {}),
                     # the target, against SDPA as its reference figures were taken (3-D input);
                     # the flash kernel (4-D input) is reported beside it and not met by numpy
                     "ok": best["attncli_numpy"] <= best["torch_sdpa"]})
    peak = max(r["sgemm_gflops"] for r in rows) * 1e9  # the best sgemm rate of the run: the strictest floor
    for r in rows:
        t = r["T"]
        r["matmul_floor_s"] = 4 * t * t * D / peak
        r["peak_sgemm_gflops"] = peak / 1e9
        r["numpy_vs_floor"] = r["seconds_best"]["attncli_numpy"] / r["matmul_floor_s"]
        r["sdpa_flash_vs_floor"] = r["seconds_best"]["torch_sdpa_flash"] / r["matmul_floor_s"]
        r["ok"] = r["ok"] and r["numpy_vs_floor"] <= 3
    return {"rows": rows, "ok": all(r["ok"] for r in rows)}


# ---- 5. today's models ---------------------------------------------------------------------


def bench_modern(t: int, repeats: int) -> dict[str, Any]:
    from attncli import attend

    rng = np.random.default_rng(t)
    H, G, W = 4, 2, t // 2
    q = rng.standard_normal((1, H, t, D)).astype(np.float32)
    k, v = (rng.standard_normal((1, H, t, D)).astype(np.float32) for _ in range(2))
    kg, vg = k[:, :G].copy(), v[:, :G].copy()  # (1, G, T, d): grouped-query heads
    fns = {
        "plain": lambda: attend(q, k, v, keep_weights=False),
        "gqa_rope_window": lambda: attend(q, kg, vg, keep_weights=False, rope="half", window=W),
        "rope_window": lambda: attend(q, k, v, keep_weights=False, rope="half", window=W),  # the stages alone, no GQA
    }
    times = interleaved(fns, repeats)
    best = {n: min(x) for n, x in times.items()}
    ratio = best["gqa_rope_window"] / best["plain"]
    return {"T": t, "heads": H, "kv_heads": G, "window": W, "seconds_best": best, "seconds_all": times,
            "ratio": ratio, "ratio_without_gqa": best["rope_window"] / best["plain"], "ok": ratio <= 1.5}


# ---- 2. start-up -----------------------------------------------------------------------


def attncli_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "attncli"
    return [str(exe)] if exe.exists() else [shutil.which("attncli") or "attncli"]


def wall(cmd: list[str], **kw: Any) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, **kw)
    return time.perf_counter() - t


def bench_startup(repeats: int) -> dict[str, Any]:
    """Wall time of each command, the commands taking turns (load hits them alike), and the ratios of issue 30
    item 9: `attncli --help` against importing what it needs (typer, rich), `attncli run` on the 4x4 example
    against importing what it needs (numpy, typer, rich, PyYAML), each at most 2x. Run as installed: compiled
    modules are written and used (PYTHONDONTWRITEBYTECODE dropped), as after `pip install`."""
    cmds = {
        "attncli_run_4x4": attncli_cmd() + ["run", str(EXAMPLE)],
        "attncli_help": attncli_cmd() + ["--help"],
        "python_import_torch": [sys.executable, "-c", "import torch"],
        # the floors: importing the libraries each needs, nothing else
        "python_import_deps": [sys.executable, "-c", "import numpy, typer, rich, yaml"],
        "python_import_typer_rich": [sys.executable, "-c", "import typer, rich"],
        "python_bare": [sys.executable, "-c", "pass"],
    }
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["COLUMNS"] = "100"
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for cmd in cmds.values():
        wall(cmd, env=env)  # warm the file cache, write the compiled modules
    for _ in range(repeats):
        for name, cmd in cmds.items():
            times[name].append(wall(cmd, env=env))
    med = {k: statistics.median(v) for k, v in times.items()}
    out: dict[str, Any] = {"median_s": med, "all_s": times}
    for name in ("attncli_run_4x4", "attncli_help"):
        out[f"{name}_speedup_vs_torch"] = med["python_import_torch"] / med[name]
    # the ratios taken turn by turn (each run against the floor measured right beside it), their median
    out["help_vs_import_typer_rich"] = statistics.median(
        a / b for a, b in zip(times["attncli_help"], times["python_import_typer_rich"], strict=True))
    out["run_vs_import_deps"] = statistics.median(
        a / b for a, b in zip(times["attncli_run_4x4"], times["python_import_deps"], strict=True))
    out["ok"] = (all(med[n] <= 0.3 and out[f"{n}_speedup_vs_torch"] >= 5 for n in ("attncli_run_4x4", "attncli_help"))
                 and out["help_vs_import_typer_rich"] <= 2 and out["run_vs_import_deps"] <= 2)
    return out


# ---- 3. memory -------------------------------------------------------------------------


PEAK_RSS = """
import sys
from pathlib import Path
from attncli.cli import main
sys.argv = ["attncli", *sys.argv[1:]]
try:
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
hwm = [ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("VmHWM")][0]
sys.stderr.write(f"PEAK {int(hwm.split()[1])}\\n")
sys.exit(code)
"""


def peak_rss(args: list[str]) -> tuple[float, float, int]:
    """(wall seconds, peak resident MB, exit code) of ``attncli ARGS`` in a child process.

    The peak is the child's own VmHWM (/proc/self/status): rusage's ru_maxrss would also count
    the memory of this (torch-importing) parent that the child had between fork and exec."""
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PEAK_RSS, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    seconds = time.perf_counter() - t
    peaks = [int(ln.split()[1]) for ln in p.stderr.splitlines() if ln.startswith("PEAK ")]
    return seconds, (peaks[0] / 1024 if peaks else float("nan")), p.returncode


def bench_memory(sizes: list[int], folder: Path) -> dict[str, Any]:
    rows = []
    for t in sizes:
        x = folder / f"x{t}.npy"
        np.save(x, np.random.default_rng(t).standard_normal((t, D)).astype(np.float32))
        out = folder / f"out{t}.npy"
        seconds, mb, code = peak_rss(["run", str(x), "--save", str(out), "--quiet"])
        ok_shape = code == 0 and np.load(out, mmap_mode="r").shape == (t, D)
        rows.append({"T": t, "seconds": seconds, "peak_rss_mb": mb, "exit_code": code, "completed": ok_shape,
                     "weights_would_take_mb": t * t * 4 / 2**20})
    first = rows[0]
    return {"rows": rows, "ok": first["peak_rss_mb"] <= 600 and all(r["completed"] for r in rows)}


# ---- 4. rendering ----------------------------------------------------------------------


def bench_render(t: int, folder: Path, repeats: int) -> dict[str, Any]:
    x = folder / f"r{t}.npy"
    np.save(x, np.random.default_rng(1).standard_normal((t, D)).astype(np.float32))
    cmds = {"default_view": attncli_cmd() + ["run", str(x)], "quiet": attncli_cmd() + ["run", str(x), "--quiet"]}
    env = {**os.environ, "COLUMNS": "100"}
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(repeats):
        for name, cmd in cmds.items():
            times[name].append(wall(cmd, env=env))
    med = {k: statistics.median(v) for k, v in times.items()}
    over = med["default_view"] - med["quiet"]
    return {"T": t, "median_s": med, "all_s": times, "view_over_compute_s": over, "ok": over < 1.0}


# ---- report ----------------------------------------------------------------------------


def table(res: dict[str, Any]) -> str:
    lines = ["target                                   measured                          goal     ok"]

    def row(name: str, measured: str, goal: str, ok: bool) -> None:
        lines.append(f"{name:<40} {measured:<33} {goal:<8} {'yes' if ok else 'NO'}")

    if "compute" in res:
        for r in res["compute"]["rows"]:
            b = r["seconds_best"]
            row(f"1 compute T={r['T']}: numpy / SDPA (3-D)", f"{r['numpy_vs_sdpa']:.2f}x ({b['attncli_numpy']:.3f} s vs "
                f"{b['torch_sdpa']:.3f} s)", "<= 1.0x", r["numpy_vs_sdpa"] <= 1.0)
            row(f"  T={r['T']}: numpy / SDPA flash (4-D)", f"{r['numpy_vs_sdpa_flash']:.2f}x (flash "
                f"{b['torch_sdpa_flash']:.3f} s)", "<= 1.0x", r["numpy_vs_sdpa_flash"] <= 1.0)
            row(f"  T={r['T']}: numpy / matmul floor", f"{r['numpy_vs_floor']:.2f}x (floor {r['matmul_floor_s']:.3f} s "
                f"@ {r['peak_sgemm_gflops']:.0f} GF/s)", "<= 3x", r["numpy_vs_floor"] <= 3)
            row(f"  T={r['T']}: SDPA flash / matmul floor", f"{r['sdpa_flash_vs_floor']:.2f}x", "report", True)
            row(f"  T={r['T']}: torch backend / SDPA flash", f"{r['torch_backend_vs_sdpa_flash']:.2f}x "
                f"({b['attncli_torch']:.3f} s)", "report", True)
            if "cuda_vs_sdpa_cuda" in r:
                row(f"  T={r['T']}: CUDA: torch backend / SDPA", f"{r['cuda_vs_sdpa_cuda']:.2f}x "
                    f"({b['attncli_cuda'] * 1e3:.2f} ms vs {b['cuda_sdpa'] * 1e3:.2f} ms)", "report", True)
    if "startup" in res:
        s = res["startup"]
        m = s["median_s"]
        for n in ("attncli_run_4x4", "attncli_help"):
            all_s = s["all_s"][n]
            row(f"2 start-up {n.replace('attncli_', '')}", f"{m[n]:.3f} s median ({min(all_s):.2f}-{max(all_s):.2f}; "
                f"python alone {m['python_bare']:.3f})", "<= 0.3 s", m[n] <= 0.3)
            row(f"  {n.replace('attncli_', '')} vs import torch ({m['python_import_torch']:.2f} s)",
                f"{s[n + '_speedup_vs_torch']:.1f}x faster", ">= 5x", s[n + "_speedup_vs_torch"] >= 5)
        if "help_vs_import_typer_rich" in s:
            row("  help / import typer, rich", f"{s['help_vs_import_typer_rich']:.2f}x (import "
                f"{m['python_import_typer_rich']:.3f} s median)", "<= 2x", s["help_vs_import_typer_rich"] <= 2)
            row("  run 4x4 / import numpy, typer, rich, yaml", f"{s['run_vs_import_deps']:.2f}x (import "
                f"{m['python_import_deps']:.3f} s median)", "<= 2x", s["run_vs_import_deps"] <= 2)
    if "memory" in res:
        for r in res["memory"]["rows"]:
            goal = "<= 600MB" if r is res["memory"]["rows"][0] else "complete"
            ok = r["peak_rss_mb"] <= 600 if goal.startswith("<=") else r["completed"]
            row(f"3 memory T={r['T']} output only", f"{r['peak_rss_mb']:.0f} MB peak RSS, {r['seconds']:.1f} s "
                f"(weights: {r['weights_would_take_mb']:.0f} MB)", goal, ok and r["completed"])
    if "modern" in res:
        r = res["modern"]
        b = r["seconds_best"]
        row(f"5 modern T={r['T']}: GQA+RoPE+window / plain", f"{r['ratio']:.2f}x ({b['gqa_rope_window']:.2f} s vs "
            f"{b['plain']:.2f} s)", "<= 1.5x", r["ok"])
        row(f"  T={r['T']}: RoPE+window (4 K/V heads) / plain", f"{r['ratio_without_gqa']:.2f}x "
            f"({b['rope_window']:.2f} s)", "report", True)
    if "render" in res:
        r = res["render"]
        row(f"4 render T={r['T']}: view - quiet", f"{r['view_over_compute_s']:+.3f} s "
            f"({r['median_s']['default_view']:.2f} vs {r['median_s']['quiet']:.2f} s)", "< 1 s", r["ok"])
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes: checks the script, not the targets")
    ap.add_argument("--only", choices=["compute", "startup", "memory", "render", "modern"], action="append")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results.json")
    args = ap.parse_args()
    only = set(args.only or ["compute", "startup", "memory", "render", "modern"])
    res: dict[str, Any] = {"machine": machine(), "quick": args.quick, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "startup" in only:  # first, before the big runs leave the machine warm and busy
            res["startup"] = bench_startup(3 if args.quick else 15)
        if "compute" in only:
            res["compute"] = bench_compute([256, 1024] if args.quick else [1024, 4096, 8192])
        if "modern" in only:
            res["modern"] = bench_modern(1024 if args.quick else 8192, 1 if args.quick else 3)
        if "render" in only:
            res["render"] = bench_render(1024 if args.quick else 4096, folder, 1 if args.quick else 3)
        if "memory" in only:
            res["memory"] = bench_memory([4096, 8192] if args.quick else [32768, 65536], folder)
    res["machine"]["load_average_end"] = list(os.getloadavg())
    res["total_seconds"] = time.perf_counter() - start
    res["all_ok"] = all(v["ok"] for k, v in res.items() if isinstance(v, dict) and "ok" in v)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2) + "\n")
    m = res["machine"]
    print(f"machine: {m['cpu']} · {m['cores']} cores · numpy {m['numpy']} · torch {m['torch']} "
          f"({m['torch_threads']} threads) · env {m['env'] or '{}'}")
    print(f"load average: start {m['load_average_start'][0]:.2f}, end {m['load_average_end'][0]:.2f}"
          f" · total {res['total_seconds']:.0f} s{' · QUICK (sizes reduced)' if args.quick else ''}")
    print(table(res))
    print(f"all targets met: {'yes' if res['all_ok'] else 'NO'} (judged against SDPA as the issue measured it, 3-D; "
          f"the flash lines are for information) · numbers in {args.json}")


if __name__ == "__main__":
    main()
