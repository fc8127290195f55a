"""``attncli inspect PATH``: the layers, attention tensors, layout and config facts of a checkpoint
(a .safetensors file, a sharded index, a save_pretrained folder or a .pt/.bin state dict); headers only."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer

from attncli.cli import app, handles_errors
from attncli.cli.options import choices

InspectFormat = choices("InspectFormat", ("rich", "json"))


@app.command("inspect", help=(
    "Show what a checkpoint holds: its attention layers, their tensors (shape, dtype), the layout "
    "detected and the facts from config.json, among them where the layer's norm sits (norm_at: before or inside "
    "the attention module, or after it for post-norm layers; --from-residual applies it, X never needs it). "
    "Reads headers only.\n\n"
    "Examples:\n\n  attncli inspect ./tiny-llama\n\n  attncli inspect model.safetensors --format json"))
@handles_errors
def inspect_command(
    path: Annotated[str, typer.Argument(help="A .safetensors file, model.safetensors.index.json, a model folder "
                                              "(save_pretrained), or a .pt/.pth/.bin state dict.")],
    format: Annotated[InspectFormat, typer.Option("--format", "-f",  # type: ignore[valid-type]
                                                  help="rich: tables; json: one JSON object on stdout.")]
        = InspectFormat("rich"),
    layout: Annotated[Optional[str], typer.Option(  # noqa: UP045 - typer reads the annotation
        "--layout", help="Read a config.json model_type attncli does not declare as this declared family "
                         "(e.g. llama), at your own risk.")] = None,
) -> None:
    from attncli.io.layouts import inspect_checkpoint

    info = inspect_checkpoint(path, layout)
    if str(getattr(format, "value", format)) == "json":
        sys.stdout.write(json.dumps(info, default=str) + "\n")
        return
    from rich.console import Console

    from attncli.render.checkpoint import render_inspect

    render_inspect(info, Console(soft_wrap=False, markup=False, emoji=False, highlight=False))
