"""``attncli inspect``: what a checkpoint holds, as a table per attention stack (rendering only)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from attncli.render import escape

FACT_ORDER = ("heads", "kv_heads", "head_dim", "scale", "causal", "rope", "rope_base", "rotary_dim", "rope_scaling",
              "window", "softcap", "qk_norm", "qk_norm_eps", "pre_norm", "norm_eps", "alibi", "sinks", "relative_bias")


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} bytes"


def render_inspect(info: dict[str, Any], console: Console) -> None:
    """The summary, then for each stack its layout, layers, the first layer's attention tensors and the facts.
    Every string in ``info`` (tensor names, model_type, paths, config values) is shown through escape.terminal."""
    info = escape.terminal_tree(info)
    files = info["files"]
    console.print(f"{info['source']}: {info['tensors']} tensors, {_size(info['bytes'])} "
                  f"({', '.join(info['dtypes'])}) in {len(files)} file{'s' if len(files) != 1 else ''}")
    console.print(f"config: {info['config'] or '(none beside the weights)'}"
                  + (f"  model_type: {info['model_type']}" if info.get("model_type") else ""))
    if not info["stacks"]:
        what = info.get("unsupported")
        console.print(f"no attention layout attncli reads{f' (recognised: {what})' if what else ''}; "
                      f"first tensors: {', '.join(info.get('tensor_names', [])[:8])}")
        return
    for s in info["stacks"]:
        console.print()
        console.print(f"layout {s['layout']}: {s['description']}")
        console.print(f"prefix {s['prefix']}, {s['layers']} layers ({s['layer_range']})")
        table = Table(title=f"attention tensors of layer {s['layer_range'].split('..')[0]}", title_justify="left")
        table.add_column("name")
        table.add_column("shape", justify="right")
        table.add_column("dtype")
        for t in s["layer_tensors"]:
            table.add_row(t["name"], str(tuple(t["shape"])), t["dtype"])
        console.print(table)
        if "error" in s:
            console.print(f"cannot be read: {s['error']}")
            continue
        facts = s["facts"]
        given = set(facts.get("from_config", []))
        ft = Table(title="facts (* from config.json)", title_justify="left")
        ft.add_column("fact")
        ft.add_column("value")
        for k in FACT_ORDER:
            v = facts.get(k)
            if v is None or v is False:
                continue
            ft.add_row(k + (" *" if k in given else ""), escape.terminal(v))
        for k, v in facts.get("extra", {}).items():
            ft.add_row(k, escape.terminal(v))
        console.print(ft)
        origin = facts.get("origin", {})
        if origin:
            ot = Table(title="textbook arrays (Q = X @ W_q)", title_justify="left")
            ot.add_column("array")
            ot.add_column("from")
            for k, v in origin.items():
                ot.add_row(k, v)
            console.print(ot)
