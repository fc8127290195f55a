"""Issue 12, one attention pipeline: each defect it names, the import graph, and one answer from every path.

References: float64 attention written in this file as plain loops (not the package's stages),
PyTorch's nn.MultiheadAttention and scaled_dot_product_attention, and the cat/milk example's
hand-computed numbers (attncli/examples/multihead_cat_milk.yaml).
"""

from __future__ import annotations

import ast
import io
import json
import math
import re
import tokenize
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attncli.cli import app
from attncli.core.engine import run
from attncli.core.layer import Layer
from attncli.core.plan import Needs, Plan, plan
from attncli.core.problem import Options, Problem
from attncli.core.projections import Projections

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "attncli" / "examples"
rng = np.random.default_rng(12)


def loop_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                   keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Single-head attention for one (m, d) problem, written with Python loops in float64."""
    m, n = q.shape[0], k.shape[0]
    w = np.zeros((m, n))
    for i in range(m):
        s = [sum(q[i, t] * k[j, t] for t in range(q.shape[1])) * scale for j in range(n)]
        alive = [j for j in range(n) if keep is None or keep[i, j]]
        if not alive:
            continue
        top = max(s[j] for j in alive)
        z = sum(math.exp(s[j] - top) for j in alive)
        for j in alive:
            w[i, j] = math.exp(s[j] - top) / z
    return w, w @ v


# ---- the defects of the issue -----------------------------------------------------------------


def test_head_explain_row_shows_that_heads_weights() -> None:
    """`self ... --head 1 --explain-row it`: head 1's weights (the example's hand numbers), not the mean."""
    res = runner.invoke(app, ["self", str(EXAMPLES / "multihead_cat_milk.yaml"), "--head", "1", "--explain-row", "it",
                              "--steps", "weights"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if "weight " in ln and "exp(x − max)" in ln]
    got = [float(ln.rsplit("weight", 1)[1]) for ln in lines]
    assert got == pytest.approx([0.0156, 0.1155, 0.0156, 0.8533], abs=5e-5)  # the example file's hand numbers
    # and the arithmetic uses head 1's value column (the taste): 3.822 = 0.0156·2 + 0.1155·3 + 0.0156·2 + 0.8533·4
    assert "= (3.8220)" in res.stdout


def test_examples_run_takes_self_options() -> None:
    res = runner.invoke(app, ["examples", "run", "multihead_cat_milk", "--head", "1", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    # every head in JSON; head 1 of the weights is the example's taste head
    w = np.array(doc["weights"])  # (H, T, S)
    np.testing.assert_allclose(w[1, 2], [0.0156, 0.1155, 0.0156, 0.8533], atol=5e-5)


@pytest.mark.parametrize("command", ["run", "self"])
def test_half_inputs_compute_in_float32_and_come_back_half(tmp_path: Path, command: str) -> None:
    """One dtype rule: float16 inputs are computed in float32 and the output is float16, for run and self."""
    x = rng.standard_normal((5, 4)).astype(np.float16)
    np.save(tmp_path / "x.npy", x)
    args = [command, str(tmp_path / "x.npy"), "--save", str(tmp_path / "t.npz"), "--quiet"]
    if command == "self":
        eye = {n: np.eye(4) for n in ("W_q", "W_k", "W_v")}
        np.savez(tmp_path / "w.npz", **{k: v.astype(np.float32) for k, v in eye.items()})
        args += ["--weights", str(tmp_path / "w.npz")]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    t = np.load(tmp_path / "t.npz")
    assert t["output"].dtype == np.float16
    assert t["scores"].dtype == np.float32
    x64 = x.astype(np.float64)
    _, ref = loop_attention(x64, x64, x64, 0.5)
    np.testing.assert_allclose(t["output"].astype(np.float64), ref, atol=2e-3)


@pytest.mark.parametrize("flag", ["--hard", "--dropout"])
def test_top_level_weights_multiplied_v(tmp_path: Path, flag: str) -> None:
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    for n, a in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{n}.npy", a)
    extra = ["--dropout", "0.4", "--seed", "2"] if flag == "--dropout" else ["--hard"]
    res = runner.invoke(app, ["run", *(str(tmp_path / f"{n}.npy") for n in "qkv"), *extra, "--save",
                              str(tmp_path / "t.npz"), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    np.testing.assert_allclose(doc["output"], np.array(doc["weights"]) @ v, rtol=1e-13)
    t = np.load(tmp_path / "t.npz")
    np.testing.assert_allclose(t["output"], t["weights"] @ v, rtol=1e-13)
    w, _ = loop_attention(q, k, v, 0.5)
    np.testing.assert_allclose(t["softmax"], w, rtol=1e-12)  # the softmax stays a step of its own


def test_float_mask_that_levels_a_row_is_not_called_masked(tmp_path: Path) -> None:
    """A float mask that makes a row's scores equal gives uniform weights, and nothing calls it masked."""
    q, k = rng.standard_normal((2, 3)), rng.standard_normal((4, 3))
    s = q @ k.T / math.sqrt(3)
    mask = np.zeros((2, 4))
    mask[1] = -s[1]  # row 1's scores become all 0
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "k.npy", k)
    np.save(tmp_path / "m.npy", mask)
    res = runner.invoke(app, ["run", str(tmp_path / "q.npy"), str(tmp_path / "k.npy"), "--mask", str(tmp_path / "m.npy"),
                              "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    np.testing.assert_allclose(doc["weights"][1], [0.25] * 4, rtol=1e-12)
    assert doc["diagnostics"]["fully_masked_rows"] == []
    view = runner.invoke(app, ["run", str(tmp_path / "q.npy"), str(tmp_path / "k.npy"), "--mask", str(tmp_path / "m.npy")])
    assert "all masked" not in view.stdout


def test_fully_masked_warning_names_the_head_output_and_the_final_row(tmp_path: Path) -> None:
    """With a projection, a fully masked query's head outputs are zero and its output row is b_o."""
    x = rng.standard_normal((2, 3, 4))
    w = {n: rng.standard_normal((4, 4)) for n in ("W_q", "W_k", "W_v", "W_o")} | {"b_o": rng.standard_normal(4)}
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "w.npz", **w)
    res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--weights", str(tmp_path / "w.npz"), "--heads", "2",
                              "--valid-lens", "3,0", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert any("head output are zero" in m for m in doc["warnings"])
    assert not any("output are zero" in m and "head" not in m for m in doc["warnings"])
    assert any("final output row is b_o" in m for m in doc["warnings"])
    np.testing.assert_allclose(np.array(doc["output"])[1], np.broadcast_to(w["b_o"], (3, 4)), rtol=1e-12)


def test_many_heads_elided_as_heads(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", rng.standard_normal((3, 6)))
    res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--heads", "6", "--seed", "0"])
    assert res.exit_code == 0, res.output
    assert "more heads not shown" in res.stdout and "batch entries" not in res.stdout


# ---- check --heads takes every option of self ----------------------------------------------------


def test_self_runs_can_be_checked_with_the_same_options(tmp_path: Path) -> None:
    x = rng.standard_normal((4, 2, 6))  # (T, B, D): --no-batch-first
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "pad.npy", np.array([[False, False, True, False], [False, False, False, False]]))
    opts = ["--heads", "2", "--init", "linear", "--no-bias", "--d-k", "8", "--seed", "3", "--no-batch-first",
            "--key-padding-mask", str(tmp_path / "pad.npy")]
    res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), *opts, "--steps", "output", "--save", str(tmp_path / "o.npy")])
    assert res.exit_code == 0, res.output
    ok = runner.invoke(app, ["check", str(tmp_path / "o.npy"), str(tmp_path / "x.npy"), *opts])
    assert ok.exit_code == 0, ok.output
    out = np.load(tmp_path / "o.npy")
    out[0, 1, 0] += 0.01
    np.save(tmp_path / "bad.npy", out)
    bad = runner.invoke(app, ["check", str(tmp_path / "bad.npy"), str(tmp_path / "x.npy"), *opts])
    assert bad.exit_code == 1


def test_prefix_picks_one_module_of_a_state_dict_for_self_and_check(tmp_path: Path) -> None:
    """A state dict with two nn.MultiheadAttention modules: --prefix picks one, for self and check alike,
    and the output is that module's own (PyTorch as the reference)."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"enc": torch.nn.MultiheadAttention(6, 2, batch_first=True),
                                 "dec": torch.nn.MultiheadAttention(6, 3, batch_first=True)}).double()
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    x = torch.randn(1, 5, 6, dtype=torch.float64)
    np.save(tmp_path / "x.npy", x.numpy())
    ref, _ = model["dec"](x, x, x)
    res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--weights", str(tmp_path / "sd.pt"), "--prefix", "dec",
                              "--heads", "3", "--steps", "output", "--save", str(tmp_path / "o.npy")])
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.save(tmp_path / "ref.npy", ref.detach().numpy())
    ok = runner.invoke(app, ["check", str(tmp_path / "ref.npy"), str(tmp_path / "x.npy"), "--weights", str(tmp_path / "sd.pt"),
                             "--prefix", "dec", "--heads", "3"])
    assert ok.exit_code == 0, ok.output
    ambiguous = runner.invoke(app, ["check", str(tmp_path / "ref.npy"), str(tmp_path / "x.npy"), "--weights",
                                    str(tmp_path / "sd.pt"), "--heads", "3"])
    assert ambiguous.exit_code == 2 and "--prefix" in ambiguous.stderr


# ---- one answer from every path -------------------------------------------------------------------


def _explained_weight(lines: list[str]) -> float:
    """The final number of an explanation's 'weight = a / b = W' line."""
    line = next(ln for ln in reversed(lines) if ln.strip().startswith(("weight =", "= ")))  # the stable form's last step
    return float(line.rsplit("=", 1)[1])


@pytest.mark.parametrize("causal", [False, True])
def test_every_path_gives_the_same_answer(tmp_path: Path, causal: bool) -> None:
    """Explicit, blocked, SDPA, multi-head with one (identity) head, check's correct computation, and
    --explain of every cell: the same weights and output, float64, to 1e-12 (and the loop reference)."""
    m, d = 6, 4
    x = rng.standard_normal((m, d))
    keep = np.tril(np.ones((m, m), dtype=bool)) if causal else None
    w_ref, out_ref = loop_attention(x, x, x, 1 / math.sqrt(d), keep)
    base = Problem.build(x, options=Options(causal=causal, dtype="float64"))

    explicit = run(base, Plan("explicit"))
    blocked = run(base, Plan("blocked"))
    assert plan(Problem.build(x, options=Options(causal=causal, backend="torch")), Needs(weights=False)).path == "sdpa"
    sdpa = run(Problem.build(x, options=Options(causal=causal, dtype="float64", backend="torch")), Plan("sdpa"))
    eye = Projections(W_q=np.eye(d), W_k=np.eye(d), W_v=np.eye(d))
    heads = run(Layer.build(x, projections=eye, heads=1, options=Options(causal=causal, dtype="float64")))
    corner = run(base, Plan("blocked", rows=(0, m - 1)))

    np.testing.assert_allclose(explicit.weights, w_ref, rtol=0, atol=1e-12)
    for t in (explicit, blocked, sdpa, heads):
        np.testing.assert_allclose(t.output, out_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(heads.weights[0], w_ref, rtol=0, atol=1e-12)  # (heads, T, S): head 0
    np.testing.assert_allclose(corner.weights, w_ref[[0, m - 1]], rtol=0, atol=1e-12)

    from attncli.check.verdict import check

    verdict = check(base, out_ref, what="output")
    assert verdict.match and verdict.comparison.max_abs_error < 1e-12

    from attncli.render import RenderOptions
    from attncli.render.explain import explanations

    cells = [f"{i},{j}" for i in range(m) for j in range(m)]
    for t in (explicit, heads):
        ex = explanations(t, RenderOptions(precision=17, explain=[("0:" if t is heads else "") + c for c in cells]))
        got = np.array([_explained_weight(e["lines"]) if not (keep is not None and not keep[e["query"], e["key"]])
                        else 0.0 for e in ex]).reshape(m, m)
        np.testing.assert_allclose(got, w_ref, rtol=0, atol=1e-12)


# ---- imports run downward only ------------------------------------------------------------------


def _import_graph() -> dict[str, set[str]]:
    """Module -> the attncli modules it imports, at module level, inside functions or under TYPE_CHECKING."""
    pkg = ROOT / "attncli"
    mods = {}
    for f in pkg.rglob("*.py"):
        name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = f
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        base = m if f.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(f.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    parts = base.split(".")
                    mod = ".".join(parts[: len(parts) - node.level + 1] + ([mod] if mod else []))
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                if t and t != m and mods[t].name != "__init__.py":  # a package's __init__ is its entrance
                    edges[m].add(t)
    return edges


def test_import_graph_has_no_cycle() -> None:
    edges = _import_graph()
    assert "attncli.core.engine" in edges and "attncli.core.ops" in edges["attncli.core.engine"]
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, path: list[str]) -> bool:
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycle.extend(path[path.index(t):] + [m, t] if t in path else [m, t])
                return True
            if t not in state and visit(t, [*path, m]):
                return True
        state[m] = 2
        return False

    for m in sorted(edges):
        if m not in state and visit(m, []):
            break
    assert not cycle, " -> ".join(cycle)


def test_the_import_check_finds_a_planted_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph above sees imports inside functions: a planted one from stages back up to engine shows."""
    src = (ROOT / "attncli" / "core" / "ops.py").read_text()
    planted = src + "\n\ndef _planted() -> None:\n    from attncli.core.engine import run  # noqa: F401\n"
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: planted if self.name == "ops.py" and
                        self.parent.name == "core" else real(self, *a, **k))
    assert "attncli.core.engine" in _import_graph()["attncli.core.ops"]


def _functions(path: Path) -> set[str]:
    """Top-level functions of a module, and methods of its classes named like stage functions."""
    tree = ast.parse(path.read_text())
    top = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    return top | {m.name for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body
                  if isinstance(m, ast.FunctionDef) and not m.name.startswith("__") and m.name in STAGE_NAMES}


STAGE_NAMES = {"softmax", "masks", "keep_mask", "apply_mask", "merge_heads", "split_heads", "expand_kv", "hard",
               "dropout", "dead_rows", "check_scores", "scale_factor", "weighted_sum", "project"}


def test_each_stage_is_defined_once() -> None:
    """No module of the package defines a function named like a stage of attncli/core/ops.py (a private
    softmax, mask fill, head merge, ...), and none computes a shifted exp(s - max) itself."""
    stages = {n.name for n in ast.parse((ROOT / "attncli" / "core" / "ops.py").read_text()).body
              if isinstance(n, ast.FunctionDef)} - {"_device", "_row_block", "_exp"}
    stages |= {"_" + name for name in stages}
    shifted = re.compile(r"exp \( \w+ - \w*(max|mx)\w* \)")
    offenders = []
    for f in (ROOT / "attncli").rglob("*.py"):
        if f.name in ("ops.py", "modern.py"):
            continue
        if f.name != "latex.py":  # render/latex.py names its TeX writers after the steps (_softmax, _hard): text only
            offenders += [f"{f.name}: def {name}" for name in _functions(f) & stages]
        code = " ".join(tok.string for tok in tokenize.generate_tokens(io.StringIO(f.read_text()).readline)
                        if tok.type not in (tokenize.STRING, tokenize.COMMENT))
        offenders += [f"{f.name}: {m.group(0)}" for m in shifted.finditer(code)]
    assert offenders == []
    planted = "def f(xp, s, mx):\n    return xp.exp(s - mx)\n"
    code = " ".join(tok.string for tok in tokenize.generate_tokens(io.StringIO(planted).readline))
    assert shifted.search(code)  # the pattern does see a copy


LAYERS = ["attncli.errors", "attncli.lazy", "attncli.core", "attncli.io", "attncli.check", "attncli.library",
          "attncli.render", "attncli.cli", "attncli.__main__"]
# low to high (DESIGN.md, "Layers"): a module imports only from its own layer or below


def _layer(module: str) -> int:
    return max(i for i, p in enumerate(LAYERS) if module == p or module.startswith(p + "."))


def test_folders_import_downward_only() -> None:
    """core < io < check < render < cli: no module imports from a folder above its own (inside a function too)."""
    edges = _import_graph()
    assert {"attncli.core.engine", "attncli.io.files", "attncli.check.variants", "attncli.render.explain"} <= set(edges)
    upward = [f"{m} -> {t}" for m, ts in edges.items() if m != "attncli" for t in ts
              if t != "attncli" and _layer(t) > _layer(m)]
    assert not upward, upward
