"""The terminal view fits its width: golden views of every bundled example at 60, 80 and 120
columns, no line wider than the terminal, and no column hidden from a table that fits.

Regenerate the goldens with ATTNCLI_REGEN_GOLDEN=1 pytest tests/test_terminal_fit.py (then
review the diff). The width is pinned per test through COLUMNS (conftest.py pins 100 otherwise).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from attncli.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden" / "views"
EXAMPLES = sorted(p.stem for p in (ROOT / "attncli" / "examples").glob("*.yaml"))
WIDTHS = (60, 80, 120)


def view(monkeypatch: pytest.MonkeyPatch, width: int, *args: str) -> str:
    monkeypatch.setenv("COLUMNS", str(width))
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.stdout


def tables(text: str) -> list[tuple[list[str], int]]:
    """(header cells, width) of every table of a view, in order."""
    out, lines = [], text.splitlines()
    for k, line in enumerate(lines):
        if line.startswith("┏"):
            cells = [c.strip() for c in lines[k + 1].strip("┃").split("┃")]
            out.append((cells, cell_len(line.rstrip())))
    return out


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", EXAMPLES)
def test_golden_views(monkeypatch: pytest.MonkeyPatch, name: str, width: int) -> None:
    text = view(monkeypatch, width, "examples", "run", name)
    path = GOLDEN / f"{name}_{width}.txt"
    if os.environ.get("ATTNCLI_REGEN_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{path.name} differs (ATTNCLI_REGEN_GOLDEN=1 regenerates)"
    wide = [ln for ln in text.splitlines() if cell_len(ln.rstrip()) > width]
    assert not wide, wide[:3]
    # a table that fits shows every column it would show on a very wide terminal
    roomy = tables(view(monkeypatch, 1000, "examples", "run", name))
    here = tables(text)
    assert len(here) == len(roomy)
    for (cells, _), (all_cells, full_width) in zip(here, roomy):
        if full_width <= width:
            assert cells == all_cells, (cells, all_cells)
        elif cells != all_cells:  # hidden columns: from the middle, with a marker, first and last kept
            assert "…" in cells and cells[1] == all_cells[1] and cells[-1] == all_cells[-1]


def test_masked_step_keeps_the_column_that_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    # d2l masked_softmax with valid lens [2, 3]: k2 is masked in batch 0 only (the example)
    text = view(monkeypatch, 80, "examples", "run", "d2l_masked_softmax")
    masked = text.split("masked = ", 1)[1].split("\n\n", 1)[0]
    assert "k2" in masked and "…" not in masked
    assert "-1e6" in masked and "-1000000" not in text  # d2l's fill, compact
    weights = text.split("weights = softmax", 1)[1].split("output", 1)[0]
    assert "·" in weights and "masked key" in weights  # masked cells marked without colour (NO_COLOR is set)


def test_cat_milk_at_60_columns_shows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for cells, _ in tables(view(monkeypatch, 60, "examples", "run", "cat_milk_sweet")):
        assert "…" not in cells


def test_explained_key_is_never_hidden(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal((4, 30)))
    y = tmp_path / "y.npy"
    np.save(y, np.random.default_rng(1).standard_normal((30, 30)))
    text = view(monkeypatch, 80, "run", str(x), str(y), "--explain", "0,15", "--steps", "weights")
    (cells, _), *_ = tables(text)
    assert "k15" in cells and "…" in cells


def test_numbers_read_the_same_in_tables_and_explanations(monkeypatch: pytest.MonkeyPatch) -> None:
    text = view(monkeypatch, 100, "examples", "run", "cat_milk_sweet", "--explain", "milk,sweet")
    assert "│ milk             │ 0.0826 │ 0.2245 │ 0.0826 │ 0.6103 │" in text  # exp(6)/(2e^4+e^5+e^6) = 0.6103
    assert "= 0.6103" in text.split("Explain weight(milk, sweet)", 1)[1]
    assert "8.0000" not in text and "│   8 │" in text  # whole numbers as whole numbers
    assert "-0.0000" not in text


def test_one_key_rows_are_not_saturated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # causal self-attention: query 0 sees key 0 only, so its weight 1 is no sign of a saturated softmax
    x = tmp_path / "x.json"
    x.write_text("[[1, 0], [0, 1], [1, 1]]")
    r = runner.invoke(app, ["run", str(x), "--causal", "-f", "json"])
    diag = json.loads(r.stdout)["diagnostics"]
    assert diag["visible_keys"] == [1, 2, 3] and diag["saturated_count"] == 0
    text = view(monkeypatch, 100, "run", str(x), "--causal", "--steps", "weights")
    assert "saturated" not in text and "out of the keys the row sees" in text


def test_many_heads_say_heads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal((3, 16)))
    text = view(monkeypatch, 100, "self", str(x), "--heads", "8", "--steps", "weights")
    assert "4 more heads not shown" in text and "batch entries" not in text
    assert "drawn from" in text  # the projections came from the seed, and the view says so


def test_drawn_score_weights_are_named_with_their_seed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    q, k = tmp_path / "q.json", tmp_path / "k.json"
    q.write_text("[[1, 0, 2]]")
    k.write_text("[[1, 0], [0, 1]]")
    text = view(monkeypatch, 100, "run", str(q), str(k), "--score", "additive", "--seed", "7", "--steps", "output")
    assert "drawn from seed 7" in text and "W_q" in text
