"""`attncli check` is bounded for every input shape and option (issue 32, item 1): the reference and each candidate
of the catalogue are computed on the output-only (blocked) path or on sampled rows, never the whole (B, H, T, T) of
every step at once, and the verdicts stay those of an independent reference.

The grid of benchmarks/views.py's check rows at a smaller T (512 × 32 query heads, so B·H·T² passes the size where
check screens the catalogue on sampled rows: the same code paths as at T = 2048), each cell `attncli check` in a
child process under a memory cap (RLIMIT_AS) and a CPU-time cap (RLIMIT_CPU), its own peak RSS held below what one
explicit run of the whole problem would take: at T = 512 one float64 step of 32 heads is 64 MB per batch entry, and
the explicit path holds scores, scaled, masked and weights at once (256 MB per batch entry).

The expected numbers come from torch's own ``scaled_dot_product_attention`` (``enable_gqa`` for grouped-query K/V,
``is_causal`` for the top-left causal mask), in float64 -- or from the same call on K/V tiled (``.repeat``: query
head h reads K/V head h % G, the classic mistake), never from attncli.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
T, H, KV, D = 512, 32, 8, 16
AS_CAP = 3 << 30  # address space of the child: a regression stops here instead of taking the machine
CPU_CAP = 300  # seconds of CPU time of the child (the catalogue's search included)

WRAP = ("import json, resource, subprocess, sys; a, c = int(sys.argv[1]), int(sys.argv[2]); "
        "lim = lambda: (resource.setrlimit(resource.RLIMIT_AS, (a, a)), resource.setrlimit(resource.RLIMIT_CPU, (c, c))); "
        "r = subprocess.run(sys.argv[3:], capture_output=True, text=True, preexec_fn=lim); "
        "u = resource.getrusage(resource.RUSAGE_CHILDREN); sys.stderr.write(r.stderr); sys.stderr.write(r.stdout); "
        "print(json.dumps([r.returncode, u.ru_maxrss / 1024, u.ru_utime + u.ru_stime, r.stdout]))")


def child(args: list[str], cwd: Path) -> tuple[int, str, float]:
    """``attncli ARGS`` under the caps: (exit code, stdout, the child's own peak RSS in MB)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", WRAP, str(AS_CAP), str(CPU_CAP), sys.executable, "-m", "attncli", *args],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=1200)
    rc, peak, _, out = json.loads(r.stdout.strip().splitlines()[-1])
    assert rc in (0, 1), r.stderr[-2000:]
    return rc, out, peak


def sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, tiled: bool = False) -> np.ndarray:
    """torch's own attention in float64: (B, H, T, d) queries, (B, G, T, d) keys and values; ``tiled``: K/V heads
    tiled (``.repeat``, head h reads h % G) instead of repeated (``repeat_interleave``, as enable_gqa)."""
    tq, tk, tv = (torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in (q, k, v))
    if tiled:
        r = tq.shape[1] // tk.shape[1]
        tk, tv = tk.repeat(1, r, 1, 1), tv.repeat(1, r, 1, 1)
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal,
                                                           enable_gqa=tq.shape[1] != tk.shape[1])
    return np.asarray(out.numpy())


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("grid")
    rng = np.random.default_rng(0)
    for batch in (1, 2):
        for dtype in ("float32", "float64"):
            np.save(d / f"q{batch}{dtype}.npy", rng.standard_normal((batch, H, T, D)).astype(dtype))
            np.save(d / f"kv{batch}{dtype}.npy", rng.standard_normal((batch, KV, T, D)).astype(dtype))
    return d


# (grouped-query, causal given to check, dtype, batch, how the expected output was computed, the verdict's words)
#   "same": SDPA with check's options (a match, exit 0); "causal": SDPA with is_causal flipped (exit 1, the entry that
#   names the forgotten or extra mask); "tiled": SDPA on K/V tiled (exit 1, kv-heads-tiled)
CASES = [
    (False, True, "float32", 1, "same", "MATCH"),
    (True, False, "float64", 2, "same", "MATCH"),
    (True, True, "float64", 2, "same", "MATCH"),
    (False, False, "float64", 1, "causal", "causal-added"),
    (True, True, "float64", 2, "causal", "causal-missing"),
    (True, True, "float32", 1, "tiled", "kv-heads-tiled"),
    (True, False, "float64", 2, "tiled", "kv-heads-tiled"),
]
BUDGET_MB = 200  # per batch entry above the process's start; an explicit run of the whole problem holds 256 MB (4 steps)


def said(rc: int, out: str, words: str) -> None:
    """check's verdict: a match (exit 0), or a mismatch (exit 1) whose explanations name ``words``."""
    verdict = json.loads(out)
    if words == "MATCH":
        assert rc == 0 and verdict["match"], out[:2000]
    else:
        named = [e["name"] for e in verdict["explanations"]]
        assert rc == 1 and not verdict["match"] and words in named, (named, out[:2000])


@pytest.mark.parametrize(("gqa", "causal", "dtype", "batch", "made", "words"), CASES)
def test_check_is_bounded_and_right(inputs: Path, tmp_path: Path, gqa: bool, causal: bool, dtype: str, batch: int,
                                    made: str, words: str) -> None:
    q = np.load(inputs / f"q{batch}{dtype}.npy")
    kv = np.load(inputs / f"kv{batch}{dtype}.npy") if gqa else q
    expected = sdpa(q, kv, kv, causal ^ (made == "causal"), tiled=made == "tiled")
    np.save(tmp_path / "expected.npy", expected.astype(dtype))  # float32: judged against plain float32 arithmetic
    kvf = str(inputs / f"kv{batch}{dtype}.npy") if gqa else str(inputs / f"q{batch}{dtype}.npy")
    args = ["check", str(tmp_path / "expected.npy"), str(inputs / f"q{batch}{dtype}.npy"), kvf, kvf,
            "--format", "json"] + (["--causal"] if causal else [])
    start = baseline(tmp_path)
    rc, out, peak = child(args, tmp_path)
    said(rc, out, words)
    assert peak - start <= BUDGET_MB * batch, (peak, start)


_BASE: list[float] = []


def baseline(tmp: Path) -> float:
    """The peak of the same command on a 4 × 4 problem: what the process takes before any attention."""
    if not _BASE:
        np.save(tmp / "tiny.npy", np.eye(4))
        _, _, peak = child(["check", str(tmp / "tiny.npy"), str(tmp / "tiny.npy"), "-q", "--what", "scores"], tmp)
        _BASE.append(peak)
    return _BASE[0]


def test_a_big_screen_samples_fewer_rows() -> None:
    """At T = 2048 × 32 heads × batch 2 the screen's sample holds 8 + 8 rows (16 MB per float64 step of its runs);
    at the test's size, 32 + 32 as before."""
    from attncli.check.variants import SAMPLE_CELLS, sample_rows
    from attncli.core.problem import Problem

    def problem(batch: int, t: int) -> Problem:
        x = np.zeros((batch, H, t, 4))
        return Problem(x, x, x)

    assert sample_rows(problem(2, 2048)) == 8
    assert 2 * 8 * 2 * H * 2048 <= SAMPLE_CELLS
    assert sample_rows(problem(1, T)) == sample_rows(problem(2, T)) == 32


def layer_reference(x: np.ndarray, w: dict[str, np.ndarray], causal: bool, tiled: bool = False) -> np.ndarray:
    """A grouped-query layer by torch, the textbook convention (Q = X W_q): heads split, SDPA, merged, W_o."""
    B, Tx, _ = x.shape

    def split(a: np.ndarray) -> np.ndarray:  # (B, T, h·d) -> (B, h, T, d)
        return a.reshape(B, Tx, -1, D).transpose(0, 2, 1, 3)

    heads = sdpa(split(x @ w["W_q"]), split(x @ w["W_k"]), split(x @ w["W_v"]), causal, tiled)  # (B, H, T, d)
    return np.asarray(heads.transpose(0, 2, 1, 3).reshape(B, Tx, H * D) @ w["W_o"])  # (B, T, H·d) x (H·d, E)


# (causal given to check, batch, how the expected output was computed, the verdict's words)
LAYER = [
    (True, 2, "same", "MATCH"),
    (False, 1, "tiled", "kv-heads-tiled"),
]


@pytest.mark.parametrize(("causal", "batch", "made", "words"), LAYER)
def test_check_of_a_layer_is_bounded_and_right(tmp_path: Path, causal: bool, batch: int, made: str, words: str) -> None:
    """`check Y X --weights W.npz --heads 32 --kv-heads 8`: a layer's projections, 32 query heads, 8 K/V heads."""
    rng = np.random.default_rng(1)
    E = H * D
    x = rng.standard_normal((batch, T, E))
    w = {"W_q": rng.standard_normal((E, H * D)) / np.sqrt(E), "W_k": rng.standard_normal((E, KV * D)) / np.sqrt(E),
         "W_v": rng.standard_normal((E, KV * D)) / np.sqrt(E), "W_o": rng.standard_normal((H * D, E)) / np.sqrt(E)}
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "w.npz", **w)
    np.save(tmp_path / "y.npy", layer_reference(x, w, causal, tiled=made == "tiled"))
    args = ["check", str(tmp_path / "y.npy"), str(tmp_path / "x.npy"), "--weights", str(tmp_path / "w.npz"),
            "--heads", str(H), "--kv-heads", str(KV), "--format", "json"] + (["--causal"] if causal else [])
    start = baseline(tmp_path)
    rc, out, peak = child(args, tmp_path)
    said(rc, out, words)
    assert peak - start <= BUDGET_MB * batch, (peak, start)


def test_check_explain_is_bounded_and_explains_as_run(inputs: Path, tmp_path: Path) -> None:
    """`check ... -x B,H:I,J` on a problem beyond ``EXPLAIN_CELLS``: each named cell computed from its query's row
    alone (no run of every weight), its arithmetic the same lines as `run --explain` gives from every weight."""
    q, kv = str(inputs / "q2float64.npy"), str(inputs / "kv2float64.npy")
    np.save(tmp_path / "expected.npy", sdpa(np.load(q), np.load(kv), np.load(kv), True))
    cells = ["1,5:300,200", "0,31:511,3"]
    explain = [a for c in cells for a in ("-x", c)]
    start = baseline(tmp_path)
    rc, out, peak = child(["check", str(tmp_path / "expected.npy"), q, kv, kv, "--causal", "--format", "json",
                           *explain], tmp_path)
    assert rc == 0, out[:2000]
    assert peak - start <= BUDGET_MB * 2, (peak, start)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ran = subprocess.run([sys.executable, "-m", "attncli", "run", q, kv, kv, "--causal", "--format", "json",
                          "--steps", "output",  # the explanations, without printing every step's numbers as JSON
                          *[a.replace("-x", "--explain") for a in explain]], capture_output=True, text=True, env=env,
                         timeout=600)
    assert ran.returncode == 0, ran.stderr
    want = json.loads(ran.stdout)["explanations"]
    got = json.loads(out)["cells"]
    assert [(g["heading"], g["lines"], g["batch"], g["query"], g["key"]) for g in got] == \
        [(w["heading"], w["lines"], w["batch"], w["query"], w["key"]) for w in want]
    assert "k200" in json.dumps(got[0]["lines"]) and got[0]["batch"] == [1, 5]
