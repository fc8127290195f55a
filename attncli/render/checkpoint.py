"""``attncli inspect``: what a checkpoint holds, as a table per attention stack (rendering only)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from attncli.errors import printable
from attncli.render import escape

FACT_ORDER = ("heads", "kv_heads", "head_dim", "scale", "causal", "rope", "rope_base", "rotary_dim", "rope_scaling",
              "window", "local_window", "chunk", "softcap", "qk_norm", "qk_norm_at", "norm_eps", "clip_qkv",
              "tuning_scale", "tuning_floor", "pre_norm", "norm_at", "pre_norm_eps", "sub_norm", "gate", "alibi", "alibi_form",
              "alibi_scaled", "sinks", "relative_bias")


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
    console.print(f"{printable(str(info['source']), 160)}: {info['tensors']} tensors, {_size(info['bytes'])} "
                  f"({', '.join(info['dtypes'])}) in {len(files)} file{'s' if len(files) != 1 else ''}")
    console.print(f"config: {printable(str(info['config'] or '(none beside the weights)'), 160)}"
                  + (f"  model_type: {printable(str(info['model_type']), 60)}" if info.get("model_type") else ""))
    if info.get("family_status"):
        console.print(f"family: {printable(str(info.get('family') or '-'), 60)}: "
                      f"{printable(str(info['family_status']), 160)}")
    keys = info.get("attention_keys") or {}
    if keys:
        kt = Table(title="config.json keys that touch attention", title_justify="left")
        kt.add_column("key")
        kt.add_column("value")
        kt.add_column("attncli")
        for k, e in keys.items():
            kt.add_row(printable(str(k), 60), printable(str(e["value"]), 60), e["status"])
        console.print(kt)
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
            table.add_row(printable(t["name"], 160), str(tuple(t["shape"])), t["dtype"])
        console.print(table)
        if "error" in s:
            console.print(f"cannot be read: {printable(str(s['error']), 300)}")
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
        for k, v in facts.get("notes", {}).items():
            ft.add_row(printable(str(k), 60), printable(str(v), 200))
        console.print(ft)
        origin = facts.get("origin", {})
        if origin:
            ot = Table(title="textbook arrays (Q = X @ W_q)", title_justify="left")
            ot.add_column("array")
            ot.add_column("from")
            for k, v in origin.items():
                ot.add_row(k, printable(str(v), 200))
            console.print(ot)
