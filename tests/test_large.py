"""Large inputs: the output-only paths (blocks of queries, torch SDPA), half precision,
memory-mapped .npy inputs, the .npy saver, --threads and the progress bar.

References: a plain-loop float64 implementation in this file (one softmax per row, written
from the definitions in DESIGN.md), PyTorch's own functions, and the explicit (full weight
matrix) path, which the blocked path must reproduce to 1e-12 in float64.
"""

from __future__ import annotations

import io
import json
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attncli.cli import app
from attncli.core import blocked
from attncli.core import plan as plan_mod
from attncli.core.backend import blas_threads, set_threads
from attncli.core.engine import attend
from attncli.core.scoring import SCORES
from attncli.io.files import Reader

runner = CliRunner()
rng = np.random.default_rng(7)


@pytest.fixture(params=["query-blocks", "key-chunks"])
def small_blocks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """query-blocks: 16 query rows against all 23 keys of both batch entries (m = 37 splits raggedly
    into 16 + 16 + 5); key-chunks: also chunks of MIN_KEYS (16) keys with the online softmax (23 = 16 + 7)."""
    monkeypatch.setattr(blocked, "BLOCK_ELEMENTS", 16 * 23 * 2 if request.param == "query-blocks" else 1)
    return str(request.param)


def loop_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray, scale: float) -> np.ndarray:
    """Masked scaled-dot attention, one query at a time, float64: keys where keep is False are
    left out; a row with no key left gives zeros (DESIGN.md's rule)."""
    m, out = q.shape[0], np.zeros((q.shape[0], v.shape[1]))
    for i in range(m):
        js = [j for j in range(k.shape[0]) if keep[i, j]]
        if not js:
            continue
        s = np.array([float(q[i] @ k[j]) * scale for j in js])
        w = np.exp(s - s.max())
        w /= w.sum()
        out[i] = sum(wj * v[j] for wj, j in zip(w, js))
    return out


# ---- blocked == full ---------------------------------------------------------------------

CASES = {
    "plain": {},
    "causal": {"causal": True},
    "causal-bottom-right": {"causal": True, "causal_align": "bottom-right"},
    "valid-lens-per-batch": {"valid_lens": [5, 0]},
    "valid-lens-per-query": {"valid_lens": rng.integers(0, 23, size=(2, 37))},
    "bool-mask-drop": {"mask": rng.random((37, 23)) < 0.3, "mask_convention": "drop"},
    "bool-mask-keep-rows-dead": {"mask": np.vstack([np.zeros((3, 23), bool), rng.random((34, 23)) < 0.5])},
    "float-mask": {"mask": np.where(rng.random((2, 37, 23)) < 0.2, -np.inf, rng.standard_normal((2, 37, 23)))},
    "mask-value-d2l": {"valid_lens": [3, 0], "mask_value": -1e6},
    "temperature-scale": {"temperature": 0.5, "scale": 0.3},
    "norm-scaling": {"scaling": "norm", "temperature": 2.0, "valid_lens": [5, 0]},  # ‖S‖_F: a first pass
}


@pytest.mark.parametrize("magnitude", [1.0, 40.0])  # 40: scores up to thousands, so the softmax keeps its running max
@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("case", list(CASES))
def test_blocked_equals_full_batched(case: str, backend: str, magnitude: float, small_blocks: str) -> None:
    q = rng.standard_normal((2, 37, 8)) * magnitude  # batch 2, m = 37 queries (ragged blocks), d = 8
    k = rng.standard_normal((1, 23, 8)) * magnitude  # broadcast over the batch, n = 23 keys
    v = rng.standard_normal((2, 23, 5))
    kw = dict(CASES[case], backend=backend, dtype="float64")
    full = attend(q, k, v, **kw)
    out = attend(q, k, v, keep_weights=False, **kw)
    assert out.names() == ["output"] and "weights" not in out
    assert out.meta.path in ("blocked", "sdpa")
    if out.meta.path == "blocked" and kw.get("scaling") != "norm":
        shift_free = magnitude == 1.0 and "mask_value" not in kw and case != "float-mask"
        assert out.meta.softmax == ("shift-free" if shift_free else "running max")
    np.testing.assert_allclose(out.output, full.output, rtol=0, atol=1e-12)
    assert out.warnings == full.warnings


@pytest.mark.parametrize(("low", "shift_free"), [(60.0, True), (85.0, False)])
def test_shift_free_softmax_near_the_float32_limits(low: float, shift_free: bool, small_blocks: str) -> None:
    """float32 scores whose rows sit near ±low (e^60 ~ 1e26, e^-60 ~ 1e-26; e^±85 is past what the
    shift-free softmax allows) against the float64 plain loop: both ways keep float32 precision."""
    d = 4
    q = np.zeros((37, d))
    q[:, 0] = np.where(np.arange(37) % 2 == 0, 1.0, -1.0) * low * math.sqrt(d)  # row i: scores ±low·k_j0
    k = np.zeros((23, d))
    k[:, 0] = 1.0 - 0.01 * np.arange(23)  # 1 .. 0.78: scores from ±0.78·low to ±low; the bound is low
    v = rng.standard_normal((23, 3))
    out = attend(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), keep_weights=False)
    assert out.meta.softmax == ("shift-free" if shift_free else "running max")
    ref = loop_reference(q, k, v, np.ones((37, 23), bool), 1 / math.sqrt(d))
    np.testing.assert_allclose(out.output, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("score", sorted(SCORES))
def test_blocked_every_score(score: str, backend: str, small_blocks: str) -> None:
    """Each registered score, called on blocks of queries, gives the explicit path's output."""
    q, k = rng.standard_normal((37, 6)), rng.standard_normal((29, 6))
    v = rng.standard_normal((29, 3))
    kw = {"score": score, "backend": backend, "dtype": "float64", "valid_lens": rng.integers(1, 30, size=37)}
    full = attend(q, k, v, **kw)
    out = attend(q, k, v, keep_weights=False, **kw)
    np.testing.assert_allclose(out.output, full.output, rtol=0, atol=1e-12)


def test_blocked_matches_plain_loop(small_blocks: str) -> None:
    """Independent check: the plain loop above, with valid lengths and causal masking."""
    q, k, v = rng.standard_normal((37, 4)), rng.standard_normal((40, 4)), rng.standard_normal((40, 3))
    limit = rng.integers(0, 41, size=37)
    keep = (np.arange(40)[None, :] < limit[:, None]) & (np.arange(40)[None, :] <= np.arange(37)[:, None])
    got = attend(q, k, v, valid_lens=limit, causal=True, keep_weights=False, dtype="float64").output
    np.testing.assert_allclose(got, loop_reference(q, k, v, keep, 1 / math.sqrt(4)), rtol=0, atol=1e-12)


def test_explicit_path_for_variants() -> None:
    """Options the fast paths do not implement (dropout here) run the explicit path instead."""
    x = rng.standard_normal((6, 4))
    t = attend(x, keep_weights=False, dropout=0.5, seed=1)
    assert t.meta.path == "explicit" and "weights" in t


# ---- torch SDPA ---------------------------------------------------------------------------

SDPA_CASES = {
    "plain": {},
    "causal": {"causal": True},
    "valid-lens": {"valid_lens": [4, 0]},
    "bool-mask": {"mask": rng.random((2, 9, 11)) < 0.6},
    "float-mask": {"mask": np.where(rng.random((9, 11)) < 0.3, -np.inf, rng.standard_normal((9, 11)))},
    "dot": {"score": "dot"},
}


@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_equals_explicit(case: str) -> None:
    q, k, v = rng.standard_normal((2, 9, 8)), rng.standard_normal((2, 11, 8)), rng.standard_normal((2, 11, 3))
    kw = dict(SDPA_CASES[case], dtype="float64")
    explicit = attend(q, k, v, backend="torch", **kw)
    fused = attend(q, k, v, backend="torch", keep_weights=False, **kw)
    assert fused.meta.path == "sdpa"
    np.testing.assert_allclose(fused.output, explicit.output, rtol=0, atol=1e-12)
    assert fused.warnings == explicit.warnings


def test_sdpa_is_pytorch() -> None:
    """Same numbers as calling torch.nn.functional.scaled_dot_product_attention directly."""
    q, k, v = (torch.randn(3, 10, 16, dtype=torch.float64) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()
    got = attend(q.numpy(), k.numpy(), v.numpy(), causal=True, backend="torch", keep_weights=False).output
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


# ---- half precision ------------------------------------------------------------------------


def test_float16_overflow_computed_in_float32() -> None:
    # values ~ 60 with d = 64: q·k reaches ~ 60·60·64 = 230 400 > 65 504, float16's largest number
    x16 = (rng.random((12, 64)) * 60).astype(np.float16)
    with np.errstate(over="ignore"):
        assert np.isinf(x16 @ x16.T).any()  # the pitfall: QKᵀ in float16 overflows
    want = attend(x16.astype(np.float64)).output  # float64 of the same (float16) numbers
    for keep in (True, False):
        t = attend(x16, keep_weights=keep)
        assert t.output.dtype == np.float16 and t.meta.dtype == "float32"
        assert not np.isnan(t.output).any()
        np.testing.assert_allclose(t.output.astype(np.float64), want, rtol=1e-2)
        assert any("overflows float16" in w and "query" in w for w in t.warnings), t.warnings


def test_float16_torch_backend_and_no_warning_when_in_range() -> None:
    x16 = rng.standard_normal((7, 8)).astype(np.float16)
    t = attend(x16, backend="torch", keep_weights=False)
    want = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(x16).double()[None],) * 3)[0]
    np.testing.assert_allclose(t.output.astype(np.float64), want.numpy(), rtol=1e-2, atol=1e-3)
    assert t.output.dtype == np.float16 and t.warnings == []


def test_bfloat16_pt_file(tmp_path: Path) -> None:
    x = torch.randn(6, 8).to(torch.bfloat16)
    path = tmp_path / "x.pt"
    torch.save({"q": x}, path)
    r = runner.invoke(app, ["run", str(path), "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    out = torch.tensor(doc["output"], dtype=torch.float32)
    want = torch.nn.functional.scaled_dot_product_attention(*(x.double()[None],) * 3)[0]
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-2, atol=1e-2)
    assert torch.equal(out.to(torch.bfloat16).float(), out)  # rounded back to bfloat16 numbers
    assert doc["dtype"] == "float32"


def test_bfloat16_tensor_through_the_api() -> None:
    x = torch.randn(5, 4).to(torch.bfloat16)
    t = attend(x, keep_weights=False)
    want = torch.nn.functional.scaled_dot_product_attention(*(x.double()[None],) * 3)[0].numpy()
    np.testing.assert_allclose(t.output, want, rtol=1e-2, atol=1e-2)


# ---- memory, files, CLI -------------------------------------------------------------------


def test_output_only_never_holds_the_weights() -> None:
    """T = 4096 in float32: the weights alone would take 64 MiB; the run peaks far below."""
    x = rng.standard_normal((4096, 32)).astype(np.float32)
    tracemalloc.start()
    try:
        attend(x, keep_weights=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4096 * 4096 * 4 / 2, f"peak {peak / 2**20:.1f} MiB"


def test_npy_inputs_are_memory_mapped(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones((3, 2)))
    assert isinstance(Reader().read(str(tmp_path / "x.npy")), np.memmap)
    buf = io.BytesIO()
    np.save(buf, np.ones((3, 2)))
    from_stdin = Reader(stdin=io.BytesIO(buf.getvalue())).read("-")
    assert not isinstance(from_stdin, np.memmap) and from_stdin.shape == (3, 2)


def test_save_npy_holds_the_output(tmp_path: Path) -> None:
    x = rng.standard_normal((50, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npy"
    r = runner.invoke(app, ["run", str(tmp_path / "x.npy"), "--save", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    want = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(x)[None],) * 3)[0].numpy()
    np.testing.assert_allclose(np.load(out), want, rtol=1e-5, atol=1e-6)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # written atomically


@pytest.mark.parametrize(("args", "code", "has_weights"), [
    (["--steps", "output", "--format", "json"], 0, False),
    (["--steps", "q,output", "--format", "json"], 0, False),
    (["--steps", "weights,output", "--format", "json"], 0, True),
    (["--format", "json"], 0, True),
    (["--threads", "1", "--format", "json"], 0, True),
    (["--threads", "0"], 2, None),
])
def test_cli_output_only(args: list[str], code: int, has_weights: bool | None, examples_dir: Path) -> None:
    r = runner.invoke(app, ["run", str(examples_dir / "cat_milk_sweet.yaml"), *args])
    assert r.exit_code == code, r.output
    if code == 0:
        doc = json.loads(r.stdout)
        assert ("weights" in doc) == has_weights
        # 'milk' row of the published example: (0, 0.5549, 3.4451, 0) (see the example file)
        np.testing.assert_allclose(doc["output"][1], [0, 0.5549, 3.4451, 0], atol=1e-4)


def test_save_npy_of_one_step(tmp_path: Path, examples_dir: Path) -> None:
    out = tmp_path / "w.npy"
    r = runner.invoke(app, ["run", str(examples_dir / "cat_milk_sweet.yaml"), "--steps", "weights", "--save", str(out),
                            "-q"])
    assert r.exit_code == 0, r.output
    # weights(milk) = softmax(4, 5, 4, 6), computed here from the definition
    e = np.exp(np.array([4.0, 5, 4, 6]))
    np.testing.assert_allclose(np.load(out)[1], e / e.sum(), atol=1e-12)


def test_threads_reach_openblas_and_torch() -> None:
    before = blas_threads()
    try:
        set_threads(1)
        assert torch.get_num_threads() == 1
        if before is not None:
            assert blas_threads() == 1  # as OpenBLAS itself reports it
    finally:
        set_threads(before or 1)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    from attncli.cli import run as run_cli

    with run_cli.progress_bar(quiet=True) as cb:
        assert cb is None
    monkeypatch.setattr("sys.stderr", io.StringIO())
    with run_cli.progress_bar(quiet=False) as cb:
        assert cb is None  # not a terminal
    term = FakeTerminal()
    monkeypatch.setattr("sys.stderr", term)
    monkeypatch.setattr(run_cli, "PROGRESS_AFTER", 0.0)
    with run_cli.progress_bar(quiet=False) as cb:
        assert cb is not None
        cb(20, 40)
        cb(40, 40)
    assert "attention" in term.getvalue()


@pytest.mark.parametrize(("args", "skipped"), [
    ([], True),
    (["--steps", "weights,output"], False),
    (["--format", "json"], False),
    (["--save", "out.npz"], False),
])
def test_default_view_of_a_big_problem_skips_the_weights(monkeypatch: pytest.MonkeyPatch, examples_dir: Path,
                                                         tmp_path: Path, args: list[str], skipped: bool) -> None:

    monkeypatch.setattr(plan_mod, "VIEW_CELLS", 15)  # the 4 × 4 example has 16 weights: "big"
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["run", str(examples_dir / "cat_milk_sweet.yaml"), *args])
    assert r.exit_code == 0, r.output
    assert ("16 attention weights are not computed" in r.output) == skipped
    assert ("softmax" in r.stdout) != skipped


CORNER_CASES = {
    "plain": {},
    "causal-bottom-right": {"causal": True, "causal_align": "bottom-right"},
    "valid-lens-per-query": {"valid_lens": rng.integers(0, 23, size=(2, 37))},
    "bool-mask": {"mask": rng.random((37, 23)) < 0.3, "mask_convention": "drop"},
    "float-mask-d2l-fill": {"mask": rng.standard_normal((2, 37, 23)), "valid_lens": [5, 0], "mask_value": -1e6},
    "additive": {"score": "additive", "hidden": 4, "seed": 1},
    "cosine-temperature": {"score": "cosine", "temperature": 0.3},
}


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("case", list(CORNER_CASES))
def test_corner_rows_are_the_full_computations_rows(case: str, backend: str) -> None:
    """The view of a big problem computes its first and last rows only (engine.corner_rows): every
    step up to the weights equals those rows of the full computation, masks and all."""
    from attncli.core.engine import run
    from attncli.core.plan import Needs, plan
    from attncli.core.problem import Options, Problem

    q, k = rng.standard_normal((2, 37, 8)), rng.standard_normal((1, 23, 8))  # batch 2, 37 queries, 23 keys
    v = rng.standard_normal((2, 23, 5))
    kw = dict(CORNER_CASES[case], backend=backend, dtype="float64")
    full = attend(q, k, v, **kw)
    opts = {key: val for key, val in kw.items() if key not in ("valid_lens", "mask")}
    problem = Problem.build(q, k, v, valid_lens=kw.get("valid_lens"), mask=kw.get("mask"),
                            options=Options().merged({**opts, "keep_weights": False}, "test"))
    assert run(problem).names() == ["output"]
    rows = [0, 1, 2, 34, 35, 36]
    how = plan(problem, Needs(view_rows=lambda m: rows, limit=1000))  # 2 × 37 × 23 weights are "big"
    assert how.rows == tuple(rows) and how.path != "explicit"
    trace = run(problem, how)
    assert trace.names() == [name for name in full.names() if name != "features"]  # additive's 4-D step: left out
    for step in trace.steps[:-1]:
        expected = full[step.name]
        if step.axes[0] == "queries":
            assert step.rows == rows
            expected = expected[..., rows, :]
        np.testing.assert_allclose(trace[step.name], expected, rtol=0, atol=1e-12, err_msg=step.name)
    np.testing.assert_allclose(trace.output, full.output, rtol=0, atol=1e-12)


def test_corner_rows_refused_when_not_the_same_computation() -> None:
    """A scaling over the whole score matrix (norm) or too many scores: nothing is added."""
    from attncli.core.engine import run
    from attncli.core.plan import Needs, plan
    from attncli.core.problem import Options, Problem

    x = rng.standard_normal((37, 8))
    for opts, limit in (({"scaling": "norm"}, 1000), ({}, 6 * 37 - 1)):
        problem = Problem.build(x, options=Options().merged(opts, "test"))
        how = plan(problem, Needs(view_rows=lambda m: [0, 1, 2, 34, 35, 36], limit=limit))
        assert how.rows is None and how.skipped == 37 * 37
        assert run(problem, how).names() == ["output"]


def test_default_view_of_a_big_problem_shows_exact_corner_rows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """40 × 40 weights over the (lowered) limit: the view shows the first and last 6 queries'
    weights, exact, with their labels and diagnostics, and says so; no weights-skipped note."""

    monkeypatch.setattr(plan_mod, "VIEW_CELLS", 1000)  # 1600 weights are "big"; 12 rows × 40 keys = 480 are not
    x = rng.standard_normal((40, 4))
    np.save(tmp_path / "x.npy", x)
    r = runner.invoke(app, ["run", str(tmp_path / "x.npy"), "--causal", "--precision", "6"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "not computed" not in r.output
    assert "showing 12 of 40 queries" in r.stdout and "only these rows were computed" in r.stdout
    w = attend(x, causal=True).weights
    weights_table = r.stdout.split("weights = softmax")[1].split("diagnostics")[0]
    row = next(line for line in weights_table.splitlines() if line.startswith("│ q39 "))
    cells = [c.strip() for c in row.split("│")[2:-1]]
    assert cells[0] == f"{w[39, 0]:.6f}" and cells[-1] == f"{w[39, 39]:.6f}"  # k0 and k39 of the last query
    assert "│ q20 " not in weights_table  # a middle row: never computed
    diag = r.stdout.split("diagnostics of the weights")[1].split("output = ")[0]
    assert "│ q39 " in diag and "│ q0 " in diag


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_overflow_is_the_same_error_on_every_path(backend: str, small_blocks: str) -> None:
    """float32 scores that overflow (row 30 holds 1e20: q_30·k_30 = 64e40 > 3.4e38) stop every path
    with the explicit path's one-line error, naming the same query and key."""
    from attncli.errors import InputError

    x = rng.standard_normal((37, 64)).astype(np.float32)
    x[30] = 1e20
    with pytest.raises(InputError) as full:
        attend(x, backend=backend)
    with pytest.raises(InputError) as fast_path:
        attend(x, backend=backend, keep_weights=False)
    assert "query 30, key 30" in str(full.value)
    assert str(fast_path.value) == str(full.value)
