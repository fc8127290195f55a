"""The terminal view: a golden rendering at a pinned width, and big inputs shown by their corners.

Regenerate goldens with ATTNCLI_REGEN_GOLDEN=1 pytest tests/test_render.py (then review the diff).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from attncli import attend
from attncli.core.trace import Trace
from attncli.render import RenderOptions
from attncli.render.terminal import print_rich

GOLDEN = Path(__file__).parent / "golden"
CAT_MILK = np.array([[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], [0, 0, 4, 0]], dtype=float)
LABELS = ["cat", "milk", "it", "sweet"]


def render_to_string(trace: Trace, opts: RenderOptions | None = None, width: int = 100) -> str:
    """The terminal view as plain text (no colour) at a fixed width, as a script's pipe gets it."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, legacy_windows=False,
                      markup=False, emoji=False)
    print_rich(trace, opts or RenderOptions(), console)
    return buf.getvalue()


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("ATTNCLI_REGEN_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from the golden (ATTNCLI_REGEN_GOLDEN=1 regenerates)"


def test_cat_milk_golden() -> None:
    t = attend(CAT_MILK, query_labels=LABELS, key_labels=LABELS)
    text = render_to_string(t, RenderOptions(precision=4), width=100)
    # the numbers a reader checks by hand are there: 0.0826 = exp(4)/(2e^4+e^5+e^6), output (1.25, 2.75)
    assert "0.0826" in text and "1.2500" in text and "2.7500" in text
    check_golden("run_cat_milk.txt", text)


def test_big_matrix_shows_corners() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 8))
    text = render_to_string(attend(x), RenderOptions(steps=["weights"]), width=120)
    assert "…" in text and "q299" in text and "k299" in text and "q150" not in text
    assert len(text.splitlines()) < 40  # not 300 rows
    full = render_to_string(attend(x[:20]), RenderOptions(steps=["weights"], full=True), width=400)
    assert "q19" in full and "k10" in full and "…" not in full


def test_batches_beyond_the_limit_are_summarised() -> None:
    x = np.ones((6, 2, 2))
    text = render_to_string(attend(x), RenderOptions(steps=["output"], max_batches=2), width=100)
    assert "batch [1] of (6,)" in text and "batch [2]" not in text and "4 more batch entries" in text
