"""Showing a check's Verdict: a terminal report, or one JSON object for scripts.

``CHECK_FORMATS`` maps ``--format`` names to functions ``(verdict, precision, out)``; ``out``
is a rich Console for ``rich`` and a text stream for ``json``. The first line of the terminal
report starts with ``MATCH`` or ``MISMATCH`` so scripts can tell a mismatch (exit 1 with a
verdict) from an internal error (exit 70, nothing on stdout).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI reads CHECK_FORMATS' names for --format: importing this module stays light
    from attncli.check.layers import LayerVerdicts
    from attncli.check.verdict import Steps, Verdict

CheckFormatter = Callable[["Verdict | Steps | LayerVerdicts", int, Any], None]
CHECK_FORMATS: dict[str, CheckFormatter] = {}
SHOWN_RTOL = 1e-8  # a relative tolerance below this (a float-rounding hair) is left out of the report
RULES = {
    "tolerance": "the fixed tolerance above, cell by cell",
    "precision": "the precision: the largest error within 2× plain arithmetic's, and every row's RMS error "
                 "within 4× plain arithmetic's in that row",
    "overall": "the overall rule: the largest error is more than 2× what plain arithmetic gives",
    "per-row": "the per-row rule: the largest error is within the overall bound, but some rows' RMS error is "
               "more than 4× plain arithmetic's in that row (their cells are judged by that row's bound)",
    "per-head": "the per-head rule: the largest error is within the overall bound, but some heads' RMS error "
                "(traced back through W_o) is more than 3× plain arithmetic's in that head, or some head's output "
                "is off by a factor (fitted in output space) more than 5× the scale plain rounding gives that head",
}


def check_format(name: str) -> Callable[[CheckFormatter], CheckFormatter]:
    def deco(fn: CheckFormatter) -> CheckFormatter:
        CHECK_FORMATS[name] = fn
        return fn

    return deco


def verdict_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, ensure_ascii=False, allow_nan=False)


def plural(what: str) -> bool:
    """Whether a step's name reads as a plural (weights, scores: 'the weights differ')."""
    return what.endswith("s") and not what.endswith("ss")


def verb(what: str, singular: str, many: str) -> str:
    return many if plural(what) else singular


@check_format("rich")
def print_rich(verdict: Verdict | Steps | LayerVerdicts, precision: int, console: Any) -> None:
    from attncli.check.layers import LayerVerdicts
    from attncli.check.verdict import Steps
    from attncli.render.wrap import say as wrapped

    if isinstance(verdict, LayerVerdicts):
        print_layers(verdict, precision, console)
        return
    if not isinstance(verdict, Steps):
        print_verdict(verdict, precision, console)
        return
    say = functools.partial(wrapped, console, align=True)
    n, bad = len(verdict.verdicts), verdict.mismatched
    from rich.text import Text

    head = Text()
    if verdict.match:
        head.append("MATCH", style="bold green")
        head.append(f": every expected step agrees ({', '.join(v.what for v in verdict.verdicts)})")
    else:
        head.append("MISMATCH", style="bold red")
        head.append(f": {len(bad)} of {n} expected steps {'differ' if len(bad) > 1 else 'differs'} ({', '.join(bad)})")
    say(head)
    for v in verdict.verdicts:
        console.print()
        print_verdict(v, precision, console)


def print_layers(result: LayerVerdicts, precision: int, console: Any) -> None:
    """One row per layer (verdict, largest error, the rule that decided), then the first diverging layer's report."""
    from rich.table import Table
    from rich.text import Text

    from attncli.render.terminal import fmt
    from attncli.render.wrap import say as wrapped

    say = functools.partial(wrapped, console, align=True)
    n, first = len(result.verdicts), result.first
    own = result.what == "weights"  # a capture's layers: the weights against the model's own
    head = Text()
    if first is None:
        head.append("MATCH", style="bold green")
        head.append(f": every layer's attention weights agree with the model's own ({n} layers of {result.source})"
                    if own else f": every layer's attention output agrees ({n} layers of {result.source})")
    else:
        bad = result.mismatched
        head.append("MISMATCH", style="bold red")
        head.append(f": {len(bad)} of {n} layers differ; the first that diverges is layer {first}")
    say(head)
    title = (f"Attention weights by layer, against the model's own ({result.source})" if own else
             f"Attention output by layer ({result.source})")
    table = Table(title=title, title_justify="left")
    for col in ("layer", "verdict", "largest error", "overall bound", "decided by", "worst cell"):  # a per-row or
        # per-head verdict is within the overall bound: the rule column says which decided
        table.add_column(col, justify="right" if col in ("layer", "largest error", "overall bound") else "left",
                         no_wrap=True)
    for i, v in zip(result.layers, result.verdicts):
        c = v.comparison
        table.add_row(str(i), Text("MATCH", style="green") if v.match else Text("MISMATCH", style="bold red"),
                      fmt(c.max_abs_error, precision), f"{v.tolerance.atol:.3g}", v.rule,
                      Text(c.worst.label if c.worst is not None else ""))
    console.print(table)
    if first is None:
        return
    console.print()
    say(Text(f"Layer {first}, the first that diverges:", style="bold"))
    print_verdict(result.verdict_of(first), precision, console)


def print_verdict(verdict: Verdict, precision: int, console: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    from attncli.render.terminal import fmt

    c, tol = verdict.comparison, verdict.tolerance
    from attncli.render.wrap import say as wrapped

    say = functools.partial(wrapped, console, align=True)  # wrapped under the value; [milk, d2] is not markup

    def f(x: float) -> str:
        return fmt(x, precision)

    head = Text()
    pr = verdict.precision
    share = f"{100 * c.mismatched / c.cells:.3g}%" if c.cells else "0%"
    if verdict.match:
        head.append("MATCH", style="bold green")
        head.append(f": the {verdict.what} {verb(verdict.what, 'agrees', 'agree')} with the expected numbers "
                    f"({c.cells} cells)" if pr is None else
                    f": the {verdict.what} {verb(verdict.what, 'is', 'are')} consistent with {pr.dtype} arithmetic "
                    f"({c.cells} cells)")
    else:
        head.append("MISMATCH", style="bold red")
        head.append(f": the {verdict.what} {verb(verdict.what, 'differs', 'differ')} from the expected numbers in "
                    f"{c.mismatched} of {c.cells} cells ({share})")
    say(head)
    say(f"  computed as    {verdict.formula}, shape {tuple(verdict.shape)}" +
        (" (the float64 reference)" if pr is not None else ""))
    if pr is not None:
        say(f"  precision      {pr.sentence()}")
        say(f"                 ({pr.source}; plain {pr.dtype}: the same stages with every operation rounded to {pr.dtype})")
    bound = f"{tol.atol:.3g}" + (f" + {tol.rtol:.3g}·|computed|" if tol.rtol > SHOWN_RTOL else "")
    say(f"  tolerance      |expected - computed| <= {bound}" + (" overall; a row's own bound where tighter"
                                                               if pr is not None else ""))
    say(f"                 {tol.origin}")
    if pr is not None:
        say(f"  decided by     {RULES[verdict.rule]}")
    if c.worst is not None:
        w = c.worst
        say(f"  largest error  {f(c.max_abs_error)} at {w.label} (expected {f(w.expected)}, computed {f(w.computed)})")
    if c.worst_rel is not None and c.max_rel_error > 0:
        say(f"  largest relative error  {c.max_rel_error:.3g} at {c.worst_rel.label}")
    d = verdict.distribution
    if d is not None and (pr is not None or not verdict.match):
        if d.rows:
            say("  errors by row    " + ", ".join(f"{k} {v:.2g}" for k, v in d.rows))
        if d.columns:
            say("  errors by column " + ", ".join(f"{k} {v:.2g}" for k, v in d.columns))
        if d.heads:
            say("  errors by head   " + ", ".join(f"{k} {v:.2g}" for k, v in d.heads[:8]))
    if c.first:
        table = Table(title=f"First mismatching cells ({len(c.first)} of {c.mismatched})", title_justify="left")
        cols = ("cell", "expected", "computed", "|error|") + (("bound", "rule") if pr is not None else ())  # per row
        for col in cols:
            table.add_column(col, justify="left" if col in ("cell", "rule") else "right", no_wrap=True)
        by_row = 0
        for cell in c.first:
            row = pr is not None and row_bound_decides(cell.error, cell.bound, tol.atol)
            by_row += row
            table.add_row(Text(cell.label), f(cell.expected), f(cell.computed), f(cell.error),
                          *((f"{cell.bound:.3g}", "row bound" if row else "overall") if pr is not None else ()))
        console.print(table)
        if by_row:
            from attncli.check.precision import ROW_FACTOR

            say(f"  row bound: within the overall bound ({tol.atol:.3g}), but the cell's row has an RMS error more "
                f"than {ROW_FACTOR:g}× plain arithmetic's in that row, so its cells are held to that row's own, tighter bound")
    for warning in verdict.warnings:
        say(Text(f"  note: {warning}", style="italic"))
    if verdict.match:
        return
    console.print()
    if verdict.explanations:
        n = len(verdict.explanations)
        say(Text(f"Explained by {n} variant{'s' if n > 1 else ''} of the catalogue "
                           f"({len(verdict.tried)} tried):", style="bold"))
        for e in verdict.explanations:
            line = Text("  • ")
            line.append(e.name, style="bold")
            line.append(f"  {'possibly ' if e.possible else ''}matches {e.formula}  (largest error {f(e.max_abs_error)})")
            say(line)
            say(f"    {e.explanation[:1].upper()}{e.explanation[1:]}.")
            if e.option is not None:
                say(f"    The expected numbers match this problem with `{e.option}`.")
        if verdict.search and any(" + " in e.name for e in verdict.explanations):
            say(f"  ({verdict.search})")
        return
    if not verdict.searched:
        say("  (the catalogue of mistakes was not searched)")
        return
    say(Text(f"No catalogued mistake explains it ({len(verdict.tried)} tried: "
                       f"{', '.join(verdict.tried) or 'none'}).", style="bold"))
    if verdict.search:
        say(f"  {verdict.search}")
    from attncli.check.variants import NEAREST_FACTOR

    if verdict.nearest:
        near = ", ".join(f"{e.name} (largest error {f(e.max_abs_error)}, {verdict.baseline / e.max_abs_error:.3g}× "
                         "smaller than no change)" if e.max_abs_error > 0 else e.name for e in verdict.nearest)
        say(f"  nearest: {near}")
    else:
        say(f"  none comes {NEAREST_FACTOR:g}× closer than no change (largest error {f(verdict.baseline)}); "
            "the errors by row, column and head above say where the numbers differ")
    d = verdict.divergence
    if d is not None:
        if d.ratio is not None:
            say(f"  every expected number is the computed one times {d.ratio:.6g}: "
                          "a constant factor (a scaling applied to the output?)")


def row_bound_decides(error: float, bound: float, overall: float) -> bool:
    """Whether a mismatching cell fails only its row's own bound (the per-row rule), within the overall one."""
    return bound < overall and error <= overall


def print_cells(cells: list[dict[str, Any]], console: Any) -> None:
    """The arithmetic of the cells ``check --explain`` names, after the verdict (the lines of ``run --explain``)."""
    from attncli.render.wrap import say

    for e in cells:  # as render.explain.print_explanations writes them
        console.print()
        say(console, e["heading"], style="bold underline")
        for line in e["lines"]:
            say(console, line)


@check_format("json")
def print_json(verdict: Verdict | Steps | LayerVerdicts, precision: int, out: Any) -> None:
    out.write(verdict_json(verdict.to_dict()) + "\n")
