"""Text wraps to the terminal at word boundaries: at 60, 80 and 120 columns every token (word, number,
formula) of the unwrapped text appears whole in the wrapped text, no line is wider than the terminal
unless it holds a single token too wide for it, and continuation lines hang under their first line.
The unwrapped text is the same command at 1000 columns (or the JSON's lines), never our wrapper's output.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

from attncli.cli import app
from attncli.render.wrap import wrap

runner = CliRunner()
WIDTHS = (60, 80, 120)
FORMULA = ("rope: θ_k = p · 10000^(-2k/8) for k = 0..3, so θ_3 = 1.400e-01 and the output is [[2,3,4,5]], "
           "[[10,11,12,13]] as d2l prints; Σ exp(row − 4) = 54.5982 + 54.5982 + 54.5982 + 54.5982 = 218.3926")


def tokens(text: str) -> list[str]:
    return text.split()


def assert_whole(unwrapped: str, wrapped: str, width: int) -> None:
    """Every token of ``unwrapped`` is a token of ``wrapped``, in the same order, and the lines fit."""
    assert tokens(unwrapped) == tokens(wrapped)
    for line in wrapped.splitlines():
        assert cell_len(line) <= width or len(line.split()) == 1, f"line wider than {width}: {line!r}"


@pytest.mark.parametrize("width", (*WIDTHS, 30))
def test_wrap_breaks_at_spaces_only(width: int) -> None:
    lines = wrap("  " + FORMULA, width)
    assert_whole(FORMULA, "\n".join(lines), width)
    for t in ("10000^(-2k/8)", "1.400e-01", "[[2,3,4,5]],", "54.5982", "218.3926"):
        assert any(t in line.split() for line in lines), t
    assert lines[0].startswith("  ") and all(line.startswith("      ") for line in lines[1:])  # hanging indent
    if width < len(FORMULA):
        assert len(lines) > 1


def test_a_token_wider_than_the_line_is_kept_whole() -> None:
    long = "x" * 50
    assert wrap(f"a {long} b", 20) == ["a", f"    {long}", "    b"]


def test_aligned_values_hang_under_the_value() -> None:
    lines = wrap("  computed as    " + " ".join(["word"] * 30), 40, align=True)
    assert all(line.startswith(" " * 17 + "word") for line in lines[1:])


def explain_part(text: str) -> str:
    return text[text.index("Explain "):]


@pytest.mark.parametrize("width", WIDTHS)
def test_explain_wraps_whole_tokens(monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    args = ["examples", "run", "cat_milk_sweet", "-x", "it,milk", "--explain-row", "it", "--steps", "weights"]
    monkeypatch.setenv("COLUMNS", "1000")
    wide = runner.invoke(app, args)
    doc = runner.invoke(app, [*args, "--format", "json"])
    monkeypatch.setenv("COLUMNS", str(width))
    r = runner.invoke(app, args)
    assert wide.exit_code == 0 and doc.exit_code == 0 and r.exit_code == 0, r.output
    assert_whole(explain_part(wide.stdout), explain_part(r.stdout), width)
    lines = [line for e in json.loads(doc.stdout)["explanations"] for line in [e["heading"], *e["lines"]]]
    assert tokens(" ".join(lines)) == tokens(explain_part(r.stdout))  # the JSON's lines, every token whole
    assert max(len(line) for line in lines) > 60  # something had to wrap at 60


@pytest.mark.parametrize("width", WIDTHS)
def test_examples_list_wraps_whole_tokens(monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    wide = runner.invoke(app, ["examples"]).stdout
    monkeypatch.setenv("COLUMNS", str(width))
    r = runner.invoke(app, ["examples"])
    assert r.exit_code == 0
    assert_whole(wide, r.stdout, width)
    names = [line.split()[0] for line in wide.split("\n\n")[0].splitlines()]
    entries = r.stdout.split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in entries if not line.startswith(" ")] == names
    col = wide.splitlines()[0].index("the notes'")
    assert all(line.startswith(" " * col) and line[col] != " " for line in entries if line.startswith(" "))


# the notes' published output rows for cat_milk_sweet (scaled after the softmax): a MISMATCH with a variant
PUBLISHED = [[0, 0.625, 1.375, 0], [0, 0.089, 1.911, 0], [0, 0.625, 1.375, 0], [0, 0.010, 1.990, 0]]


def report(width: int) -> str:
    import numpy as np

    from attncli.check.verdict import check as run_check
    from attncli.check.verdict import infer_tolerance
    from attncli.cli.inputs import build_problem
    from attncli.cli.options import ProblemArgs
    from attncli.io.files import Reader
    from attncli.render.check import CHECK_FORMATS

    path = Path(__file__).resolve().parent.parent / "attncli" / "examples" / "cat_milk_sweet.yaml"
    problem = build_problem([str(path)], ProblemArgs(), Reader())
    written = [f"{x:.3f}" if x else "0" for row in PUBLISHED for x in row]
    verdict = run_check(problem, np.array(PUBLISHED), tolerance=infer_tolerance(written, source="published.yaml"))
    buf = io.StringIO()
    CHECK_FORMATS["rich"](verdict, 4, Console(file=buf, width=width, color_system=None, force_terminal=False))
    return buf.getvalue()


def strip_tables(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not re.match(r"^[┏┃┡│└]", line) and "mismatching" not in line)


@pytest.mark.parametrize("width", WIDTHS)
def test_check_report_wraps_whole_tokens(width: int) -> None:
    wide, narrow = strip_tables(report(1000)), strip_tables(report(width))
    assert_whole(wide, narrow, width)
    assert "MISMATCH" in narrow and "scale-after-softmax" in narrow
    for line in narrow.splitlines():  # a continuation never starts at the margin: it hangs under its item
        assert line.startswith(("MISMATCH", "Explained", "No variant", " ")) or not line.strip(), line
