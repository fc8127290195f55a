"""``attncli check``: tolerance from written precision, exit codes, JSON verdicts, the cat/milk example.

Reference numbers are computed here with plain numpy float64 (``sdpa`` below), never by attncli.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.check.verdict import decimals, infer_tolerance, written_numbers
from attncli.cli import app
from attncli.render.check import CHECK_FORMATS

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
CAT = str(ROOT / "examples" / "cat_milk_sweet.yaml")
# The self-attention note (shared/seeds, example 1) publishes these output rows for cat, milk, it,
# sweet in the two shown dimensions; the hidden dimensions are 0.
CAT_PUBLISHED = [[0, 0.625, 1.375, 0], [0, 0.089, 1.911, 0], [0, 0.625, 1.375, 0], [0, 0.010, 1.990, 0]]


def sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(QKᵀ/√d)·V in float64, by hand."""
    s = q @ k.T / math.sqrt(q.shape[-1])
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True) @ v


def rand(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))


def save_inputs(tmp_path: Path, seed: int = 0) -> tuple[list[str], np.ndarray]:
    q, k, v = rand(seed)
    names = []
    for name, a in zip("qkv", (q, k, v)):
        np.save(tmp_path / f"{name}.npy", a)
        names.append(str(tmp_path / f"{name}.npy"))
    return names, sdpa(q, k, v)


def rows_text(a: np.ndarray, places: int) -> list[list[str]]:
    return [[f"{x:.{places}f}" for x in row] for row in a]


def as_yaml(cells: list[list[str]]) -> str:
    return "".join(f"- [{', '.join(r)}]\n" for r in cells)


def as_json(cells: list[list[str]]) -> str:
    return "[" + ", ".join("[" + ", ".join(r) + "]" for r in cells) + "]"


def as_csv(cells: list[list[str]]) -> str:
    return "".join(",".join(r) + "\n" for r in cells)


WRITERS = {".yaml": as_yaml, ".json": as_json, ".csv": as_csv}


def one_digit_off(cells: list[list[str]], truth: np.ndarray, places: int) -> list[list[str]]:
    """The same numbers with the last digit of cell [1][0] moved one unit away from the true value."""
    out = [list(r) for r in cells]
    x = float(out[1][0])
    unit = 10.0 ** -places
    out[1][0] = f"{x + unit if x >= truth[1, 0] else x - unit:.{places}f}"
    return out


# ---- written precision ----------------------------------------------------------------------

@pytest.mark.parametrize("text,places", [("0.625", 3), ("2", 0), ("-0.50", 2), ("1.5e-3", 4), ("1e-6", 6),
                                         ("3.25E+1", 1), (".5", 1), ("12.", 0), ("abc", None), ("nan", None)])
def test_decimals(text: str, places: int | None) -> None:
    assert decimals(text) == places


def test_written_numbers_keep_the_text_of_each_format() -> None:
    assert written_numbers("- [0.10, 2]\n- [3.000, 4]\n", ".yaml") == ["0.10", "2", "3.000", "4"]
    assert written_numbers('{"expected": [[0.10, 2]], "q": [[1.5]]}', ".json") == ["0.10", "2"]
    assert written_numbers("# c\n0.10,2\n3.000,4\n", ".csv") == ["0.10", "2", "3.000", "4"]
    assert written_numbers("q: [[1.25]]\nexpected: [[0.5, 0.125]]\n", ".yaml") == ["0.5", "0.125"]
    assert written_numbers("[[1, 2]]", ".npy") is None


def test_inferred_tolerance_is_half_a_unit_of_the_last_decimal() -> None:
    tol = infer_tolerance(["0.625", "1", "0.5"])
    assert tol.atol == pytest.approx(0.0005, rel=1e-5) and tol.rtol < 1e-8
    # whole numbers and binary files: the float defaults of torch.testing.assert_close
    assert infer_tolerance(["1", "0"]).atol == 1e-7
    assert infer_tolerance(None, "float32").rtol == 1.3e-6 and infer_tolerance(None, "float32").atol == 1e-5


# ---- rounded expected numbers match, and fail when one digit changes ----------------------------

@pytest.mark.parametrize("ext", list(WRITERS))
@pytest.mark.parametrize("places", [2, 3, 4])
def test_rounded_numbers_match_and_one_digit_fails(tmp_path: Path, ext: str, places: int) -> None:
    inputs, truth = save_inputs(tmp_path, seed=places)
    cells = rows_text(truth, places)
    good = tmp_path / f"good{ext}"
    good.write_text(WRITERS[ext](cells))
    r = runner.invoke(app, ["check", str(good), *inputs])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("MATCH")
    bad = tmp_path / f"bad{ext}"
    bad.write_text(WRITERS[ext](one_digit_off(cells, truth, places)))
    r = runner.invoke(app, ["check", str(bad), *inputs, "--format", "json"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "mismatch" and doc["mismatched_cells"] == 1
    assert doc["first_mismatches"][0]["index"] == [1, 0] and doc["first_mismatches"][0]["label"] == "[q1, d0]"
    assert doc["tolerance"]["atol"] == pytest.approx(0.5 * 10.0 ** -places, rel=1e-5)


@pytest.mark.parametrize("places", [2, 4])
def test_inline_expected(tmp_path: Path, places: int) -> None:
    inputs, truth = save_inputs(tmp_path, seed=7)
    cells = rows_text(truth, places)
    assert runner.invoke(app, ["check", "--expected", as_json(cells), *inputs]).exit_code == 0
    r = runner.invoke(app, ["check", "-e", as_json(one_digit_off(cells, truth, places)), *inputs])
    assert r.exit_code == 1 and r.output.startswith("MISMATCH")


def test_binary_expected_uses_the_float_default(tmp_path: Path) -> None:
    inputs, truth = save_inputs(tmp_path, seed=8)
    np.save(tmp_path / "exact.npy", truth)
    r = runner.invoke(app, ["check", str(tmp_path / "exact.npy"), *inputs, "-f", "json"])
    assert r.exit_code == 0
    assert json.loads(r.stdout)["tolerance"]["atol"] == 1e-7  # float64 default
    np.save(tmp_path / "off.npy", truth + 1e-5)
    assert runner.invoke(app, ["check", str(tmp_path / "off.npy"), *inputs]).exit_code == 1
    # the same with a looser tolerance given
    assert runner.invoke(app, ["check", str(tmp_path / "off.npy"), *inputs, "--atol", "1e-4"]).exit_code == 0


def test_weights_are_compared_with_what_weights(tmp_path: Path) -> None:
    q, k, v = rand(9)
    s = q @ k.T / 2.0  # d = 4
    w = np.exp(s - s.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    inputs, _ = save_inputs(tmp_path, seed=9)
    (tmp_path / "w.csv").write_text(as_csv(rows_text(w, 4)))
    assert runner.invoke(app, ["check", str(tmp_path / "w.csv"), *inputs, "--what", "weights"]).exit_code == 0
    assert runner.invoke(app, ["check", str(tmp_path / "w.csv"), *inputs]).exit_code == 2  # shape (3,5) vs (3,2)


def test_problem_file_with_its_own_expected_entry(tmp_path: Path) -> None:
    q, k, v = rand(10)
    truth = sdpa(q, k, v)
    doc = {"q": q.tolist(), "k": k.tolist(), "v": v.tolist(), "expected": np.round(truth, 3).tolist()}
    (tmp_path / "p.json").write_text(json.dumps(doc))
    r = runner.invoke(app, ["check", str(tmp_path / "p.json"), "-f", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tolerance"]["atol"] == pytest.approx(0.0005, rel=1e-5)


def test_expected_from_stdin(tmp_path: Path) -> None:
    inputs, truth = save_inputs(tmp_path, seed=11)
    r = runner.invoke(app, ["check", "-", *inputs], input=as_yaml(rows_text(truth, 3)))
    assert r.exit_code == 0, r.output


# ---- the cat/milk example: the notes' numbers are softmax(QKᵀ)·V / √d ---------------------------

def test_cat_milk_published_numbers_name_scaling_after_softmax(tmp_path: Path) -> None:
    exp = tmp_path / "published.yaml"
    exp.write_text(as_yaml([[f"{x:.3f}" if x else "0" for x in row] for row in CAT_PUBLISHED]))
    r = runner.invoke(app, ["check", str(exp), CAT])
    assert r.exit_code == 1
    assert r.output.startswith("MISMATCH")
    text = " ".join(r.output.split())
    assert "scale-after-softmax matches softmax(QKᵀ)·V / √d" in text
    assert "The scaling was applied after the softmax instead of to the scores" in text
    r = runner.invoke(app, ["check", "--expected", json.dumps(CAT_PUBLISHED), CAT, "--format", "json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["verdict"] == "mismatch"
    assert [e["name"] for e in doc["explanations"]] == ["scale-after-softmax"]
    assert doc["worst_cell"]["label"] == "[sweet, d2]"
    # the correct numbers, by hand: cat = it = the mean of the rows (all scores 8); the rest by sdpa
    x = np.array([[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], [0, 0, 4, 0]], dtype=float)
    correct = np.round(sdpa(x, x, x), 4)
    assert correct[0].tolist() == [0, 1.25, 2.75, 0]
    assert runner.invoke(app, ["check", "--expected", json.dumps(correct.tolist()), CAT]).exit_code == 0


@pytest.mark.parametrize("what", ["output", "weights", "scores"])
def test_the_example_file_carries_correct_expected_numbers(what: str) -> None:
    # examples/cat_milk_sweet.yaml has an `expected:` mapping by step (the correct math, 4 decimals)
    r = runner.invoke(app, ["check", CAT, "--what", what, "-f", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["match"] is True


def test_every_expected_step_of_a_problem_file_is_checked(tmp_path: Path) -> None:
    # The README's cat/milk numbers, by hand: scores QKᵀ (milk: 8 10 8 12), weights(milk) = softmax(4, 5, 4, 6)
    x = np.array([[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], [0, 0, 4, 0]], dtype=float)
    s = np.array([4.0, 5, 4, 6])
    milk = np.exp(s) / np.exp(s).sum()
    assert np.round(milk, 4).tolist() == [0.0826, 0.2245, 0.0826, 0.6103]
    assert (x @ x.T)[1].tolist() == [8, 10, 8, 12] and np.round(sdpa(x, x, x)[1], 4).tolist() == [0, 0.5549, 3.4451, 0]
    text = Path(CAT).read_text()
    assert "0.6103]" in text
    r = runner.invoke(app, ["check", CAT, "-f", "json"])  # the correct file: every step MATCH
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["verdict"] == "match"
    assert list(doc["steps"]) == ["scores", "weights", "output"]
    assert all(v["match"] for v in doc["steps"].values())
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("0.6103]", "0.6200]"))  # one expected weight changed
    r = runner.invoke(app, ["check", str(bad)])
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    assert lines[0].startswith("MISMATCH: 1 of 3 expected steps") and "(weights)" in lines[0]
    assert [ln.split(":")[0] for ln in lines if ln.startswith(("MATCH:", "MISMATCH:"))][1:] == \
        ["MATCH", "MISMATCH", "MATCH"]
    assert "the weights differ from the expected numbers in 1 of 16 cells" in r.stdout
    assert "[milk, sweet]" in r.stdout
    doc = json.loads(runner.invoke(app, ["check", str(bad), "-f", "json"]).stdout)
    assert doc["mismatched_steps"] == ["weights"]
    worst = doc["steps"]["weights"]["worst_cell"]
    assert worst["label"] == "[milk, sweet]" and worst["computed"] == pytest.approx(milk[3], abs=1e-12)
    # --what still picks one step: the output alone agrees
    assert runner.invoke(app, ["check", str(bad), "--what", "output"]).exit_code == 0


# ---- exit codes and JSON for bad input ----------------------------------------------------------

BAD = [
    (["check", "missing.yaml", CAT], "no such file"),
    (["check", "--expected", "[[1, 2]", CAT], "is not a list of numbers"),
    (["check", "--expected", "[[1, 2]]", CAT], "have shape (1, 2), but the computed output has shape (4, 4)"),
    (["check", "--expected", "[[a, b]]", CAT], "non-numbers"),
    (["check", "NOEXP"], "no 'expected' entry"),
    (["check", CAT, "--what", "scaled"], "has expected numbers for scores, weights, output but not for 'scaled'"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "noexp.yaml").write_text("q: [[1, 2], [3, 4]]\n")
    args = [str(tmp_path / "noexp.yaml") if a == "NOEXP" else a for a in args]
    r = runner.invoke(app, args)
    assert r.exit_code == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == ""
    r = runner.invoke(app, [*args, "--format", "json"])
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "error" and message in doc["errors"][0]


# check's own options refused (their values, or their use with these inputs): one line on stderr naming the flag,
# exit 2 and nothing on stdout, in every format (issue 32: one rule); --what is refused before computing where the
# chain's stages tell (a step no computation has; a stage these options do not give)
OWN = [
    (["check", "--expected", json.dumps(CAT_PUBLISHED), CAT, "--what", "nope"], "--what: no computation has a step 'nope'"),
    (["check", CAT, "--what", "weigths"], "did you mean 'weights'?"),
    (["check", CAT, "--what", "masked"], "--what: this computation has no step 'masked'"),
    (["check", "--expected", json.dumps(CAT_PUBLISHED), CAT, "--what", "q_rot"], "no step 'q_rot' (its chain: scores,"),
    (["check", "--expected", json.dumps(CAT_PUBLISHED), CAT, "--what", "k_norm"], "no step 'k_norm'"),
    (["check", "--expected", json.dumps(CAT_PUBLISHED), CAT, "--what", "alibi"], "no step 'alibi'"),
    (["check", "--expected", json.dumps(CAT_PUBLISHED), CAT, "--what", "q"], "--what: the step 'q', which this computation"),
    (["check", CAT, "--what", "head_output"], "--what: the step 'head_output', which this computation does not have"),
    (["check", CAT, "--what", "softmax"], "--what: the step 'softmax', which this computation does not have"),
    (["check", CAT, "-x", "9,9"], "--explain: '9,9': query index 9 is out of range"),
    (["check", CAT, "--atol", "inf"], "--atol: must be a finite number"),
    (["check", CAT, "--rtol", "nan"], "--rtol: must be a finite number"),
    (["check", CAT, "--atol", "1e-3", "--precision-of", "bfloat16"], "--precision-of: "),
    (["check", "--expected", "[[1]]", CAT, "--weights", "nowhere", "--layer", "all"], "--expected: is not offered"),
    (["check", CAT, "--weights", "nowhere", "--layer", "all", "-x", "0,0"], "--explain: is not offered"),
]
# ...and typer's own refusals of them, through the program's entry point (which makes them one line)
TYPER_OWN = [(["check", CAT, "-p", "99"], "'--precision'"), (["check", CAT, "--precision-of", "float8"], "'--precision-of'"),
             (["check", CAT, "--format", "xml"], "'--format'")]


@pytest.mark.parametrize("args,message", OWN)
@pytest.mark.parametrize("fmt", list(CHECK_FORMATS))
def test_own_options_refused_write_nothing_on_stdout(args: list[str], message: str, fmt: str) -> None:
    r = runner.invoke(app, [*args, "--format", fmt])
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == "", r.stdout


@pytest.mark.parametrize("args,message", TYPER_OWN)
def test_own_options_refused_by_typer_write_nothing_on_stdout(args: list[str], message: str) -> None:
    import os
    import subprocess
    import sys

    for fmt in [[]] if "--format" in args else [["--format", f] for f in CHECK_FORMATS]:
        r = subprocess.run([sys.executable, "-m", "attncli", *args, *fmt], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stdout == "", r.stdout


def test_what_is_refused_before_the_problem_is_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage the options do not give is told by the chain: the engine never runs."""
    import attncli.core.engine as engine

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("computed")

    monkeypatch.setattr(engine, "run", boom)
    r = runner.invoke(app, ["check", "--expected", json.dumps(CAT_PUBLISHED), CAT, "--what", "q_rot", "-f", "json"])
    assert r.exit_code == 2 and "no step 'q_rot'" in r.stderr and r.stdout == ""


def test_every_step_recorded_is_one_what_accepts() -> None:
    """--what is checked against attncli.core.trace.StepName before anything is read: every step that any score,
    and a layer with every stage on q and k, records must be a member (else a real step would be refused)."""
    from attncli.check.verdict import absent_step
    from attncli.core.engine import run
    from attncli.core.layer import Layer
    from attncli.core.problem import Options, Problem
    from attncli.core.projections import Projections
    from attncli.core.scoring import SCORES
    from attncli.core.trace import StepName

    r = np.random.default_rng(0)
    q, k, v = r.normal(size=(3, 4)), r.normal(size=(5, 4)), r.normal(size=(5, 2))
    seen: set[str] = set()
    for score in SCORES:
        p = Problem.build(q, k, v, options=Options(score=score, causal=True, causal_align="bottom-right"))
        names = run(p).names()
        assert [n for n in names if absent_step(p, n)] == []  # what a run records, absent_step never refuses
        seen.update(names)
    x = r.normal(size=(1, 5, 8))
    w = {n: r.normal(size=(8, 8)) for n in ("W_q", "W_k", "W_v", "W_o")}
    layer = Layer.build(x, projections=Projections(**w), heads=2, q_norm=np.ones(4), k_norm=np.ones(4), sinks=np.zeros(2),
                        options=Options(rope="half", qk_norm="rms", softcap=30.0, alibi=True, clip_qkv=1.0,
                                        tuning_scale=0.1, hard=True, causal=True, window=3))
    names = run(layer).names()
    assert [n for n in names if absent_step(layer, n)] == []
    seen.update(names)
    assert seen - {s.value for s in StepName} == set()
    assert {"q_rot", "k_norm", "capped", "alibi", "masked", "sink", "hard", "q_clip", "head_output"} <= seen


def test_quiet_prints_nothing(tmp_path: Path) -> None:
    r = runner.invoke(app, ["check", "-q", "--expected", json.dumps(CAT_PUBLISHED), CAT])
    assert r.exit_code == 1 and r.stdout == ""


def test_internal_error_is_told_apart_from_a_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    import attncli.check.verdict as check_module

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(check_module, "check", boom)
    r = runner.invoke(app, ["check", "--expected", json.dumps(CAT_PUBLISHED), CAT])
    assert r.exit_code == 70 and r.stdout == "" and "internal error" in r.stderr  # EX_SOFTWARE, not a mismatch
    r = runner.invoke(app, ["check", "--expected", json.dumps(CAT_PUBLISHED), CAT, "-f", "json"])
    assert r.exit_code == 70 and json.loads(r.stdout)["verdict"] == "internal-error"


def test_json_has_only_the_verdict_on_stdout() -> None:
    r = runner.invoke(app, ["check", "--expected", json.dumps(CAT_PUBLISHED), CAT, "-f", "json"])
    doc = json.loads(r.stdout)  # one JSON object, nothing else
    for key in ("verdict", "match", "what", "tolerance", "max_abs_error", "max_rel_error", "first_mismatches",
                "explanations", "errors", "variants_tried"):
        assert key in doc
    assert io.StringIO(r.stdout).read().count("\n") == 1


def test_multihead_file_with_heads_in_the_wrong_order(tmp_path: Path) -> None:
    # two heads of width 1 over X (4, 2) with identity projections: head h attends with feature h only.
    x = np.array([[2, 2], [1, 3], [2, 2], [0, 4]], dtype=float)
    heads = []
    for h in range(2):
        s = x[:, h:h + 1] @ x[:, h:h + 1].T  # (4, 1) x (1, 4) -> (4, 4), scaled by √1
        e = np.exp(s - s.max(axis=1, keepdims=True))
        heads.append(e / e.sum(axis=1, keepdims=True) @ x[:, h:h + 1])
    swapped = np.concatenate(heads[::-1], axis=1)  # head 1 first: the mistake
    doc = {"x": x.tolist(), "heads": 2, "labels": ["cat", "milk", "it", "sweet"],
           "weights": {n: np.eye(2).tolist() for n in ("W_q", "W_k", "W_v", "W_o")}, "expected": swapped.tolist()}
    (tmp_path / "mh.json").write_text(json.dumps(doc))
    r = runner.invoke(app, ["check", str(tmp_path / "mh.json"), "-f", "json"])
    assert r.exit_code == 1, r.output
    assert [e["name"] for e in json.loads(r.stdout)["explanations"]] == ["heads-wrong-order"]
    doc["expected"] = np.concatenate(heads, axis=1).tolist()
    (tmp_path / "mh.json").write_text(json.dumps(doc))
    assert runner.invoke(app, ["check", str(tmp_path / "mh.json")]).exit_code == 0


# ---- the terminal report: a golden at width 100 (ATTNCLI_REGEN_GOLDEN=1 regenerates) -------------

def test_cat_milk_report_golden() -> None:
    import os

    from rich.console import Console

    from attncli.check.verdict import check as run_check
    from attncli.check.verdict import infer_tolerance
    from attncli.cli.inputs import build_problem
    from attncli.cli.options import ProblemArgs
    from attncli.io.files import Reader
    from attncli.render.check import CHECK_FORMATS

    problem = build_problem([CAT], ProblemArgs(), Reader())
    written = [f"{x:.3f}" if x else "0" for row in CAT_PUBLISHED for x in row]
    verdict = run_check(problem, np.array(CAT_PUBLISHED), tolerance=infer_tolerance(written, source="published.yaml"))
    buf = io.StringIO()
    CHECK_FORMATS["rich"](verdict, 4, Console(file=buf, width=100, color_system=None, force_terminal=False))
    path = Path(__file__).parent / "golden" / "check_cat_milk.txt"
    if os.environ.get("ATTNCLI_REGEN_GOLDEN"):
        path.write_text(buf.getvalue())
    assert buf.getvalue() == path.read_text(), "the report differs from the golden (ATTNCLI_REGEN_GOLDEN=1 regenerates)"


# ---- property: any inputs, any of 2–4 decimals: the rounded truth matches, one digit off does not ----

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), places=st.integers(2, 4), m=st.integers(1, 4), n=st.integers(1, 5),
       cell=st.integers(0, 100))
def test_rounding_property(seed: int, places: int, m: int, n: int, cell: int) -> None:
    from attncli.check.verdict import check as run_check
    from attncli.core.problem import Problem

    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(m, 3)), rng.normal(size=(n, 3)), rng.normal(size=(n, 2)) * 3
    truth = sdpa(q, k, v)
    text = as_yaml(rows_text(truth, places))
    tol = infer_tolerance(written_numbers(text, ".yaml"))
    problem = Problem.build(q, k, v)
    rounded = np.array([[float(x) for x in row] for row in rows_text(truth, places)])
    assert run_check(problem, rounded, tolerance=tol).match, text
    i, j = divmod(cell % truth.size, truth.shape[1])
    off = rounded.copy()
    off[i, j] += 10.0 ** -places if rounded[i, j] >= truth[i, j] else -(10.0 ** -places)
    verdict = run_check(problem, off, tolerance=tol, explain=False)
    assert not verdict.match and verdict.comparison.mismatched == 1


def test_no_explain_and_rtol_alone() -> None:
    r = runner.invoke(app, ["check", "--no-search", "-e", json.dumps(CAT_PUBLISHED), CAT, "-f", "json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["explanations"] == [] and doc["variants_tried"] == []
    # largest relative error: sweet's first shown dimension, |0.010 - 0.1780| / 0.1780 = 0.944 (correct value from
    # the example's comment, 0.1780 = sdpa by hand): a relative tolerance of 0.95 accepts them all, 0.9 does not
    assert runner.invoke(app, ["check", "--rtol", "0.95", "-e", json.dumps(CAT_PUBLISHED), CAT]).exit_code == 0
    assert runner.invoke(app, ["check", "--rtol", "0.9", "-e", json.dumps(CAT_PUBLISHED), CAT]).exit_code == 1


def test_explain_cells_after_the_verdict_as_run_explains_them(tmp_path: Path) -> None:
    """``check EXPECTED Q K V -x 1,2`` prints, after its verdict, the lines ``run Q K V -x 1,2`` prints (both from
    render/explain.py), on a match and on a mismatch; the weight they end with is the float64 softmax by hand."""
    inputs, truth = save_inputs(tmp_path)
    np.save(tmp_path / "exact.npy", truth)
    np.save(tmp_path / "off.npy", truth + 0.1)
    ran = runner.invoke(app, ["run", *inputs, "-x", "1,2", "-x", "0,4"], env={"COLUMNS": "100"})
    assert ran.exit_code == 0, ran.output
    explained = ran.output[ran.output.index("Explain weight(q1, k2)"):].strip()
    q, k, _ = rand()
    s = q @ k.T / math.sqrt(q.shape[-1])
    w = np.exp(s) / np.exp(s).sum(axis=-1, keepdims=True)
    assert f"= {w[1, 2]:.4f}" in explained.split("Explain weight(q0, k4)")[0]
    assert f"= {w[0, 4]:.4f}" in explained.split("Explain weight(q0, k4)")[1]
    for expected, code in (("exact.npy", 0), ("off.npy", 1)):
        r = runner.invoke(app, ["check", str(tmp_path / expected), *inputs, "-x", "1,2", "--explain", "0,4"],
                          env={"COLUMNS": "100"})
        assert r.exit_code == code, r.output
        assert r.output.startswith("MATCH" if code == 0 else "MISMATCH")
        assert r.output.strip().endswith(explained), r.output
    r = runner.invoke(app, ["check", str(tmp_path / "exact.npy"), *inputs, "-x", "1,2", "-f", "json"])
    doc = json.loads(r.output)
    assert r.exit_code == 0 and doc["verdict"] == "match"
    [cell] = doc["cells"]
    assert (cell["query"], cell["key"]) == (1, 2) and any(f"= {w[1, 2]:.4f}" in line for line in cell["lines"])


def test_explain_of_a_cell_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    inputs, truth = save_inputs(tmp_path)
    np.save(tmp_path / "exact.npy", truth)
    r = runner.invoke(app, ["check", str(tmp_path / "exact.npy"), *inputs, "-x", "7,0"])
    assert r.exit_code == 2 and "--explain" in r.output and "out of range" in r.output, r.output
    assert "MATCH" not in r.output
