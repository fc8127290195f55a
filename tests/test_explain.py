"""Explain mode and diagnostics: the arithmetic of one cell / one row, entropy and effective keys,
saturation and score-spread warnings, output similarity, the heatmap view, NO_COLOR, --svg/--html.

Goldens: ATTNCLI_REGEN_GOLDEN=1 pytest tests/test_explain.py regenerates them (review the diff).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from attncli import attend
from attncli.cli import app
from attncli.core.diagnostics import attach as diagnose
from attncli.render import RenderOptions
from attncli.render.explain import attach as explain
from attncli.render.explain import num, print_explanations
from attncli.render.terminal import print_rich

GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = Path(__file__).resolve().parent.parent / "attncli" / "examples"
CAT_MILK = np.array([[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], [0, 0, 4, 0]], dtype=float)
LABELS = ["cat", "milk", "it", "sweet"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")

runner = CliRunner()


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("ATTNCLI_REGEN_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from the golden (ATTNCLI_REGEN_GOLDEN=1 regenerates)"


def cat_milk(**options: object):
    return attend(CAT_MILK, query_labels=LABELS, key_labels=LABELS, **options)


def render(trace, opts: RenderOptions, fn=print_rich) -> str:
    buf = io.StringIO()
    fn(trace, opts, Console(width=100, color_system=None, file=buf))
    return buf.getvalue()


def softmax64(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---- explanations -----------------------------------------------------------------------------


def test_explain_cell_arithmetic_as_the_notes_write_it() -> None:
    t = cat_milk()
    opts = RenderOptions(explain=["it,milk", "milk,cat"])
    ex = explain(t, opts)
    it_milk, milk_cat = ("\n".join(e["lines"]) for e in ex)
    # the notes: sim(it, milk) = 1×2 + 3×2 = 8 (here q·k with q = it = (2, 2), k = milk = (1, 3)); d = 4
    assert "sim(it, milk) = q(it) · k(milk) = 2×1 + 2×3 = 8" in it_milk
    assert "scaled: 8 / √4 = 4" in it_milk
    assert "= 0.25" in it_milk  # the it row is uniform: 8 8 8 8
    # milk row: scores 8 10 8 12 -> 4 5 4 6; weight(milk, cat) = e^4 / (2e^4 + e^5 + e^6), float64 by hand
    w = math.exp(4) / (2 * math.exp(4) + math.exp(5) + math.exp(6))
    assert f"= {w:.4f}" in milk_cat and f"{w:.4f}" == "0.0826"
    assert "Σ exp(row) = exp(4) + exp(5) + exp(4) + exp(6)" in milk_cat
    assert f"{2 * math.exp(4) + math.exp(5) + math.exp(6):.4f}" in milk_cat  # 661.0383, the row's sum
    assert "row max 6 is subtracted" in milk_cat


def test_explain_row_weighted_sum_of_values() -> None:
    t = cat_milk()
    (row,) = explain(t, RenderOptions(explain_rows=["it"]))
    text = "\n".join(row["lines"])
    # uniform weights: out(it) = the mean of the value rows = (0, 1.25, 2.75, 0)
    assert "out(it) = 0.2500·v(cat) + 0.2500·v(milk) + 0.2500·v(it) + 0.2500·v(sweet)" in text  # as the tables write 0.2500
    assert "= (0, 1.2500, 2.7500, 0)" in text
    (row,) = explain(t, RenderOptions(explain_rows=["milk"]))
    w = softmax64(np.array([4.0, 5.0, 4.0, 6.0]))
    out = w @ CAT_MILK
    assert f"= (0, {out[1]:.4f}, {out[2]:.4f}, 0)" in "\n".join(row["lines"])


def test_golden_explain_cat_milk() -> None:
    t = cat_milk()
    text = render(t, RenderOptions(explain=["it,milk", "milk,sweet"], explain_rows=["it", "milk"]),
                  print_explanations)
    check_golden("explain_cat_milk.txt", text)


def test_golden_diagnostics_and_similarity_cat_milk() -> None:
    t = cat_milk()
    diagnose(t, "dot")
    text = render(t, RenderOptions(steps=["weights", "output"]))
    check_golden("diagnostics_cat_milk.txt", text)


def test_explain_masked_cell_and_batch_prefix() -> None:
    # d2l: valid lens [2, 3]; batch 0 keeps keys 0, 1 only
    x = np.arange(16, dtype=float).reshape(2, 2, 4) / 10
    t = attend(x, np.eye(4), np.eye(4), valid_lens=np.array([2, 3]), score="dot")
    (masked, kept) = explain(t, RenderOptions(explain=["0:1,3", "1:1,2"]))
    assert "batch 0" in masked["heading"] and "-inf, so its weight is exactly 0" in "\n".join(masked["lines"])
    w = softmax64(x[1, 1, :3])[2]  # batch 1, query 1 keeps 3 keys
    assert f"= {num(w)}" in "\n".join(kept["lines"])


@pytest.mark.parametrize("spec, message", [
    ("it,bread", "no key named 'bread'"),
    ("it", "expected QUERY,KEY"),
    ("7,1", "query index 7 is out of range"),
    ("0:it,milk", "no batch axes"),
])
def test_explain_bad_cells_exit_2_one_line(spec: str, message: str) -> None:
    r = runner.invoke(app, ["run", str(EXAMPLES / "cat_milk_sweet.yaml"), "--explain", spec])
    assert r.exit_code == 2
    assert message in r.output and len(r.output.strip().splitlines()) == 1


def test_explain_in_json() -> None:
    r = runner.invoke(app, ["run", str(EXAMPLES / "cat_milk_sweet.yaml"), "--format", "json", "--explain", "milk,cat",
                            "--explain-row", "it", "--similarity", "cosine"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [e["what"] for e in doc["explanations"]] == ["cell", "row"]
    assert any("0.0826" in line for line in doc["explanations"][0]["lines"])
    # cosine of output rows: it and cat are the same word, so after attention their outputs agree: cos = 1
    assert doc["diagnostics"]["similarity"]["after"][2][0] == pytest.approx(1.0, abs=1e-12)


# ---- diagnostics ------------------------------------------------------------------------------


def test_entropy_and_effective_keys_match_torch() -> None:
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 7, 4)), rng.standard_normal((2, 7, 3))
    t = attend(q, k, v)
    d = diagnose(t)
    # independent reference: torch.distributions.Categorical on torch's own softmax, float64
    s = torch.from_numpy(q) @ torch.from_numpy(k).transpose(-1, -2) / 2.0
    ref = torch.distributions.Categorical(probs=torch.softmax(s, dim=-1)).entropy().numpy()
    np.testing.assert_allclose(d["entropy"], ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(d["effective_keys"], np.exp(ref), rtol=1e-12)
    assert d["argmax"] == torch.argmax(s, dim=-1).tolist()


def test_uniform_and_one_hot_rows() -> None:
    # cat and it have uniform weights over 4 keys: entropy ln 4, 4 effective keys
    d = diagnose(cat_milk())
    assert d["entropy"][0] == pytest.approx(math.log(4), abs=1e-12)
    assert d["effective_keys"][2] == pytest.approx(4.0, abs=1e-12)
    assert d["argmax_key"][1] == "sweet" and d["saturated_rows"] == [] and d["warnings"] == []


def test_saturation_warning_only_for_a_saturated_row() -> None:
    # row 0 scores (20, 0, 0): weight e^20 / (e^20 + 2) > 0.99; row 1 scores (1, 0, 0): not saturated
    q = np.array([[20.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    d = diagnose(attend(q, np.eye(3), np.eye(3), score="dot"))
    assert [r["index"] for r in d["saturated_rows"]] == [[0]]
    assert d["saturated_rows"][0]["max_weight"] == pytest.approx(math.exp(20) / (math.exp(20) + 2), rel=1e-12)
    assert any("q0 is saturated" in w for w in d["warnings"])
    assert not any("q1" in w for w in d["warnings"])


def test_score_spread_warning_for_unscaled_dot_only() -> None:
    # unscaled dot on cat/milk: row sweet spreads 8..16 = 8 > 2·√4 = 4
    d = diagnose(cat_milk(score="dot"))
    assert d["score_spread"]["max_row_spread"] == 8 and d["score_spread"]["row"] == "sweet"
    assert any("unscaled dot products" in w for w in d["warnings"])
    assert "score_spread" not in diagnose(cat_milk())  # scaled-dot: no such warning


def test_fully_masked_rows_both_fills() -> None:
    x = np.ones((2, 2, 3))
    for mask_value in (None, -1e6):
        d = diagnose(attend(x, valid_lens=np.array([0, 2]), mask_value=mask_value))
        assert d["fully_masked_rows"] == ["q0 (batch 0)", "q1 (batch 0)"]
        assert d["entropy"][0] == [None, None] and d["entropy"][1][0] == pytest.approx(math.log(2))


def test_similarity_of_outputs_cat_milk() -> None:
    d = diagnose(cat_milk(), "dot")
    # correct outputs: it = (0, 1.25, 2.75, 0), milk = (0, 0.5549, 3.4451, 0): it·milk > it·cat (the notes' claim)
    w = softmax64(np.array([4.0, 5.0, 4.0, 6.0]))
    milk = w @ CAT_MILK
    it = CAT_MILK.mean(axis=0)
    after = np.array(d["similarity"]["after"])
    assert after[2, 1] == pytest.approx(it @ milk, rel=1e-12) and after[2, 0] == pytest.approx(it @ it, rel=1e-12)
    assert after[2, 1] > after[2, 0]
    assert d["similarity"]["before"][2][1] == 8.0  # sim(it, milk) = 8 before attention


# ---- terminal view: heatmap, NO_COLOR, non-terminal, pictures ---------------------------------


def test_heatmap_colours_in_a_colour_terminal_only() -> None:
    t = cat_milk()
    buf = io.StringIO()
    print_rich(t, RenderOptions(steps=["weights"]), Console(file=buf, width=100, force_terminal=True,
                                                            color_system="truecolor", no_color=False))
    assert "48;2;" in buf.getvalue()  # background colours of the heatmap
    buf = io.StringIO()
    print_rich(t, RenderOptions(steps=["weights"]), Console(file=buf, width=100, force_terminal=True,
                                                            color_system="truecolor", no_color=True))
    assert "48;2;" not in buf.getvalue() and "38;2;" not in buf.getvalue()


def test_cli_output_is_plain_when_not_a_terminal_or_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    r = runner.invoke(app, ["run", str(EXAMPLES / "cat_milk_sweet.yaml"), "--explain", "it,milk"])
    assert r.exit_code == 0 and not ANSI.search(r.output)
    monkeypatch.delenv("NO_COLOR")
    r = runner.invoke(app, ["run", str(EXAMPLES / "cat_milk_sweet.yaml")])  # CliRunner's stdout is not a tty
    assert r.exit_code == 0 and not ANSI.search(r.output)


def test_big_weights_say_how_to_see_everything() -> None:
    x = np.random.default_rng(0).standard_normal((40, 4))
    text = render(attend(x), RenderOptions(steps=["weights"]))
    assert re.search(r"showing 12 of 40 queries × \d+ of 40 keys", text) and "--full" in text and "--save" in text
    assert "0.0…" not in text and "… │" in text  # fewer corner columns rather than cut cells
    assert max(len(line) for line in text.splitlines()) <= 100


@pytest.mark.parametrize("kind", ["svg", "html"])
def test_svg_and_html_contain_the_tables_numbers(tmp_path: Path, kind: str) -> None:
    out = tmp_path / f"view.{kind}"
    r = runner.invoke(app, ["run", str(EXAMPLES / "cat_milk_sweet.yaml"), f"--{kind}", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    for number in ("0.0826", "0.6103", "1.2500", "2.7500"):  # weights(milk) and output(it), see the example
        assert number in text
    # also with --format json: the view is rendered off screen, stdout stays pure JSON
    r = runner.invoke(app, ["run", str(EXAMPLES / "cat_milk_sweet.yaml"), "--format", "json", f"--{kind}", str(out)])
    assert r.exit_code == 0 and json.loads(r.stdout)["output"][2][1] == 1.25


def test_svg_needs_the_svg_extension(tmp_path: Path) -> None:
    r = runner.invoke(app, ["run", str(EXAMPLES / "cat_milk_sweet.yaml"), "--svg", str(tmp_path / "v.png")])
    assert r.exit_code == 2 and "--svg writes .svg files" in r.output and not (tmp_path / "v.png").exists()


# ---- the other scores show their own intermediates --------------------------------------------


def cell_text(trace, spec: str) -> str:
    (e,) = explain(trace, RenderOptions(explain=[spec]))
    return "\n".join(e["lines"])


def test_explain_cosine() -> None:
    text = cell_text(cat_milk(score="cosine"), "it,milk")
    # by hand: it = (2, 2), milk = (1, 3): q·k = 8, ‖q‖ = √8, ‖k‖ = √10, cos = 8 / √80
    assert "q(it) · k(milk) = 2×1 + 2×3 = 8" in text
    assert f"‖q(it)‖ = {num(math.sqrt(8))},  ‖k(milk)‖ = {num(math.sqrt(10))}" in text
    assert text.splitlines()[2].endswith(f"= {num(8 / math.sqrt(80))}")


def test_explain_gaussian() -> None:
    t = attend(np.array([[2.5]]), np.array([[2.4292], [1.0]]), np.array([[1.0], [0.0]]), score="gaussian", bandwidth=1.0)
    text = cell_text(t, "0,0")
    d2 = (2.5 - 2.4292) ** 2  # by hand; the score is -d²/(2σ²) with σ = 1
    assert f"(2.5000 − 2.4292)² = {num(d2)}" in text and f"= {num(-d2 / 2)}" in text


def test_explain_additive() -> None:
    # h = 2 by hand: q W_q = (1, 0) W_q, k W_k; features = tanh(sum); score = w_v · features
    W_q, W_k, w_v = np.array([[0.5, -1.0], [2.0, 0.25]]), np.array([[1.0, 0.5]]), np.array([2.0, -3.0])
    q, k = np.array([[1.0, 0.0]]), np.array([[0.3], [-0.2]])
    t = attend(q, k, np.eye(2), score="additive", params={"W_q": W_q, "W_k": W_k, "w_v": w_v})
    text = cell_text(t, "0,1")
    f = np.tanh(q[0] @ W_q + k[1] @ W_k)  # (2,) + (2,)
    assert "q(q0) W_q = (0.5000, -1)" in text and "k(k1) W_k = (-0.2000, -0.1000)" in text
    assert f"tanh(q W_q + k W_k) = ({num(f[0])}, {num(f[1])})" in text
    assert text.splitlines()[3].endswith(f"= {num(float(w_v @ f))}")
