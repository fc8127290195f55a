"""What every head does, shown: a layers × heads table (patterns, or one statistic in the colour map), CSV, and one
figure with a layers × heads panel per statistic. Reads the JSON object of attncli.io.headsfile.document."""

from __future__ import annotations

import csv
import io
import math
from typing import IO, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attncli.render import colours
from attncli.render.escape import terminal as terminal_text

SHORT = {"sink": "sink", "previous-token": "prev", "self": "self", "induction": "ind", "broad": "broad",
         "focused": "foc"}


def _grid(doc: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    return {(r["layer"], r["head"]): r for r in doc["statistics"]}


def table(doc: dict[str, Any], console: Console, metric: str | None = None) -> None:
    """The layers × heads table: each head's patterns (abbreviated, the key below), or ``metric``'s mean coloured
    from its smallest to its largest value."""
    cells = _grid(doc)
    heads, layers = doc["heads"], doc["layers"]
    title = f"heads: {metric} (mean over queries)" if metric else "heads: patterns (thresholds below; blank: unnamed)"
    t = Table(title=title, show_lines=False)
    t.add_column("layer", justify="right")
    for h in range(heads):
        t.add_column(str(h), justify="right" if metric else "left")
    values = [r[metric]["mean"] for r in doc["statistics"]] if metric else []
    finite = [v for v in values if v is not None]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    for layer in layers:
        row: list[Any] = [str(layer)]
        for h in range(heads):
            r = cells[(layer, h)]
            if metric:
                v = r[metric]["mean"]
                if v is None:
                    row.append(Text("—"))
                    continue
                c = colours.rgb((v - lo) / (hi - lo) if hi > lo else 1.0)
                fg = "white" if colours.dark(*c) else "black"
                row.append(Text(f"{v:.3f}", style=f"{fg} on rgb({c[0]},{c[1]},{c[2]})"))
            else:
                row.append(Text(",".join(SHORT[p] for p in r["patterns"])))
        t.add_row(*row)
    console.print(t)
    if not metric:
        evidence(doc, console)
    lim = doc["thresholds"]
    console.print(Text("; ".join(f"{SHORT[p]} = {p}: {v['statistic']} >= {v['at_least']:g}" for p, v in lim.items()),
                       style="dim"))


EVIDENCE = {"sink": "of its weight on the first token", "previous-token": "on the previous token",
            "self": "on its own token", "induction": "on the token after the previous occurrence",
            "broad": "of the largest entropy", "focused": "on its strongest key"}
SHOWN = 24  # named heads listed with their evidence


def evidence(doc: dict[str, Any], console: Console) -> None:
    """Each named head with the numbers that name it: 'layer 1 head 3: sink — 0.83 of its weight on the first
    token' (the first SHOWN)."""
    from attncli.core.headstats import beside

    named = [r for r in doc["statistics"] if r["patterns"]]
    for r in named[:SHOWN]:
        parts = []
        for p in r["patterns"]:
            stat, limit = doc["thresholds"][p]["statistic"], doc["thresholds"][p]["at_least"]
            parts.append(f"{p} — {beside(r[stat]['mean'], limit)} {EVIDENCE.get(p, stat)} (≥ {limit:g})")
        console.print(Text(f"layer {r['layer']} head {r['head']}: " + "; ".join(parts)))
    if len(named) > SHOWN:
        console.print(Text(f"… and {len(named) - SHOWN} more named heads (--format json lists them all)", style="dim"))


def top(doc: dict[str, Any], console: Console, metric: str, k: int) -> None:
    """The K heads highest on ``metric`` (heads where it is defined)."""
    rows = [r for r in doc["statistics"] if r[metric]["mean"] is not None]
    rows.sort(key=lambda r: (-r[metric]["mean"], r["layer"], r["head"]))
    t = Table(title=f"top {k} heads by {metric}")
    for c in ("layer", "head", metric, "std", "n", "patterns"):
        t.add_column(c, justify="left" if c == "patterns" else "right")
    for r in rows[:k]:
        s = r[metric]
        t.add_row(str(r["layer"]), str(r["head"]), f"{s['mean']:.4f}", "—" if s["std"] is None else f"{s['std']:.4f}",
                  str(s["n"]), terminal_text(", ".join(r["patterns"])))
    console.print(t)


def to_csv(doc: dict[str, Any], out: IO[str], names: list[str]) -> None:
    """One row per head (tidy): layer, head, patterns, then each statistic's mean, std, n."""
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["layer", "head", "patterns"] + [f"{n}{s}" for n in names for s in ("", "_std", "_n")])
    for r in doc["statistics"]:
        row: list[Any] = [r["layer"], r["head"], ";".join(r["patterns"])]
        for n in names:
            s = r[n]
            row += ["" if s["mean"] is None else repr(s["mean"]), "" if s["std"] is None else repr(s["std"]), s["n"]]
        w.writerow(row)


def csv_text(doc: dict[str, Any], names: list[str]) -> str:
    buf = io.StringIO()
    to_csv(doc, buf, names)
    return buf.getvalue()


def plot(doc: dict[str, Any], out: IO[bytes], fmt: str, names: list[str]) -> None:
    """One figure: a layers × heads panel per statistic (those measured), in the colour map; blank where undefined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cells = _grid(doc)
    layers, heads = doc["layers"], doc["heads"]
    shown = [n for n in names if any(r[n]["mean"] is not None for r in doc["statistics"])]
    cols = min(4, max(1, len(shown)))
    rows = max(1, math.ceil(len(shown) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 0.3 * len(layers) * rows + 1.6 * rows), squeeze=False)
    for ax in axes.flat[len(shown):]:
        ax.axis("off")
    for ax, name in zip(axes.flat, shown):
        a = np.array([[np.nan if (v := cells[(layer, h)][name]["mean"]) is None else v for h in range(heads)]
                      for layer in layers])
        im = ax.imshow(a, cmap=colours.CMAP, aspect="auto", interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.set_yticks(range(len(layers)), [str(x) for x in layers], fontsize=7)
        fig.colorbar(im, ax=ax, fraction=0.05)
    fig.tight_layout()
    fig.savefig(out, format=fmt)
    plt.close(fig)
