"""Every big output is bounded for every input shape and option (issue 32): --html, --plot and the viewer
compute a block of queries at a time for grouped-query shapes, separate Q/K/V files, batches, float64,
masks and --explain-row, never the whole (B, H, T, T) at once.

The grid of benchmarks/views.py at a smaller T (512 × 32 query heads: beyond a page of tables and beyond
a panel's pixels, so the same code paths), each cell a child process with a memory cap (RLIMIT_AS) and a
CPU-time cap (RLIMIT_CPU: a busy machine does not inflate it, unlike wall time), whose own peak memory
(ru_maxrss of that child alone) is held below what the whole weights of one step would take on top of
the process's start: at T = 512 one float64 step of 32 heads is 64 MB per batch entry, and a run that
held every step (scores, scaled, masked, weights) at once would pass 256 MB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
T, H, KV, D = 512, 32, 8, 16
AS_CAP = 3 << 30  # address space of the child: a regression stops here instead of taking the machine
CPU_CAP = 120  # seconds of CPU time of the child


WRAP = ("import json, resource, subprocess, sys; a, c = int(sys.argv[1]), int(sys.argv[2]); "
        "lim = lambda: (resource.setrlimit(resource.RLIMIT_AS, (a, a)), resource.setrlimit(resource.RLIMIT_CPU, (c, c))); "
        "r = subprocess.run(sys.argv[3:], capture_output=True, text=True, preexec_fn=lim); "
        "u = resource.getrusage(resource.RUSAGE_CHILDREN); sys.stderr.write(r.stderr); "
        "print(json.dumps([r.returncode, u.ru_maxrss / 1024, u.ru_utime + u.ru_stime]))")


def child(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """``attncli ARGS`` under the caps, in a wrapper that reports that child's own peak RSS (MB) and CPU seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", WRAP, str(AS_CAP), str(CPU_CAP), sys.executable, "-m", "attncli", *args],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=900)
    rc, peak, cpu = json.loads(r.stdout.strip().splitlines()[-1])
    return subprocess.CompletedProcess(args, rc, "", r.stderr), peak, cpu


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("grid")
    rng = np.random.default_rng(0)
    for batch in (1, 2):
        for dtype in ("float32", "float64"):
            np.save(d / f"q{batch}{dtype}.npy", rng.standard_normal((batch, H, T, D)).astype(dtype))
            np.save(d / f"kv{batch}{dtype}.npy", rng.standard_normal((batch, KV, T, D)).astype(dtype))
    return d


def files(d: Path, gqa: bool, batch: int, dtype: str) -> list[str]:
    q = str(d / f"q{batch}{dtype}.npy")
    kv = str(d / f"kv{batch}{dtype}.npy") if gqa else q
    return [q, kv, kv]  # Q, K, V as three files (Q = K = V without grouped heads)


# (grouped-query, causal, --explain-row, dtype, batch, peak MB above the process's start)
HTML = [
    (False, True, False, "float32", 1, 120),
    (True, False, False, "float32", 1, 120),
    (False, False, True, "float32", 1, 120),  # Q = K = V as three files with --explain-row: every weight before
    (True, True, True, "float64", 2, 200),
    (True, False, False, "float64", 1, 160),
    (False, True, True, "float64", 2, 200),
]


@pytest.mark.parametrize(("gqa", "causal", "row", "dtype", "batch", "budget"), HTML)
def test_html_is_bounded(inputs: Path, tmp_path: Path, gqa: bool, causal: bool, row: bool, dtype: str, batch: int,
                         budget: int) -> None:
    start = baseline(tmp_path)
    out = tmp_path / "a.html"
    args = ["run", *files(inputs, gqa, batch, dtype), "-q", "--html", str(out)] + (["--causal"] if causal else []) + (
        ["--explain-row", f"{batch - 1},5:300"] if row else [])
    r, peak, cpu = child(args, tmp_path)
    assert r.returncode == 0, r.stderr
    assert peak - start <= budget, (peak, start)
    text = out.read_text()
    assert len(text) <= 25e6 * T * T / 2048 ** 2 + 2e6  # the page's 25 MB at T = 2048, in proportion (plus headroom)
    assert text.count("<figure>") == batch * H  # every head drawn
    if row:
        assert "row q300" in text and "head 5" in text  # the named row, explained


@pytest.mark.parametrize(("gqa", "dtype", "batch", "budget"), [(True, "float64", 2, 200), (False, "float32", 1, 120)])
def test_html_with_steps_is_bounded(inputs: Path, tmp_path: Path, gqa: bool, dtype: str, batch: int,
                                    budget: int) -> None:
    """`run ... -q --html a.html --steps weights,output`: --steps only choose what is shown or saved, and nothing
    else is: the page is made from blocks, the run of every weight is not made (the steps are checked on one row)."""
    start = baseline(tmp_path)
    out = tmp_path / "a.html"
    args = ["run", *files(inputs, gqa, batch, dtype), "-q", "--causal", "--html", str(out), "--steps", "weights,output"]
    r, peak, _ = child(args, tmp_path)
    assert r.returncode == 0, r.stderr
    assert peak - start <= budget, (peak, start)
    assert out.read_text().count("<figure>") == batch * H


def test_html_with_an_unknown_step_is_refused_and_writes_nothing(inputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.html"
    r, _, _ = child(["run", *files(inputs, True, 1, "float32"), "-q", "--html", str(out), "--steps", "weights,nosuch"],
                    tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--steps" in lines[0] and "nosuch" in lines[0] and "weights" in lines[0]
    assert not out.exists()


PLOT = [
    (False, True, "float32", 1, 120),
    (True, False, "float64", 2, 160),
]


@pytest.mark.slow
@pytest.mark.parametrize(("gqa", "causal", "dtype", "batch", "budget"), PLOT)
def test_plot_is_bounded(inputs: Path, tmp_path: Path, gqa: bool, causal: bool, dtype: str, batch: int,
                         budget: int) -> None:
    pytest.importorskip("matplotlib")
    start = baseline(tmp_path, plot=True)
    out = tmp_path / "a.png"
    args = ["run", *files(inputs, gqa, batch, dtype), "-q", "--plot", str(out)] + (["--causal"] if causal else [])
    r, peak, _ = child(args, tmp_path)
    assert r.returncode == 0, r.stderr
    assert peak - start <= budget, (peak, start)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


_BASE: dict[bool, float] = {}


def baseline(tmp: Path, plot: bool = False) -> float:
    """The peak of the same command on a 4 × 4 problem: what the process takes before any attention."""
    if plot not in _BASE:
        np.save(tmp / "tiny.npy", np.eye(4))
        args = ["run", str(tmp / "tiny.npy"), "-q"] + (["--plot", str(tmp / "tiny.png")] if plot else
                                                       ["--html", str(tmp / "tiny.html")])
        r, peak, _ = child(args, tmp)
        assert r.returncode == 0, r.stderr
        _BASE[plot] = peak
    return _BASE[plot]


@pytest.mark.parametrize("causal", [False, True])
def test_plot_from_blocks_draws_what_the_trace_draws(causal: bool) -> None:
    """The blocked --plot (a Layer's per-pixel maxima) and the trace's --plot (attncli.render.plot's own
    downsampling of every weight) give the same picture, masked cells grey in both."""
    pytest.importorskip("matplotlib")
    import io

    from matplotlib.image import imread

    import attncli
    from attncli.core.options import Options
    from attncli.core.problem import Problem
    from attncli.render.bigplot import plot_problem
    from attncli.render.plot import PlotOptions, plot_steps

    x = np.random.default_rng(2).standard_normal((1, 2, 700, 8))
    opts = PlotOptions(steps=["scores", "weights"])
    blocked = io.BytesIO()
    problem = Problem(q=x, k=x, v=x, options=Options(causal=causal))
    assert plot_problem(problem, blocked, "png", opts) is not None  # 700 > a panel's pixels: drawn from blocks
    whole = io.BytesIO()
    plot_steps(attncli.attend(x, causal=causal), whole, "png", opts)
    a, b = (imread(io.BytesIO(buf.getvalue()), format="png") for buf in (blocked, whole))
    assert a.shape == b.shape
    differ = np.abs(a - b).max(axis=-1) > 2 / 255
    assert differ.mean() < 1e-3, differ.mean()
