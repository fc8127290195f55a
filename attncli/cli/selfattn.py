"""``attncli self``: self-attention and multi-head attention, step by step."""

from __future__ import annotations

from typing import Annotated

import typer

from attncli.cli import app, handles_errors
from attncli.cli.options import ProblemArgs, View, takes_options

SELF_HELP = """Self-attention and multi-head attention: project X, split into heads, attend, concatenate.

Q = X W_q (+ b_q), K = Y W_k, V = Y W_v (Y = X, or --memory for cross-attention), split into
--heads H heads of width d_k/H, scaled dot-product attention per head, the heads side by side
in order, then W_o (+ b_o). X is (T, D) or (B, T, D).

Weights (--weights) use the textbook convention Q = X @ W_q, W_q of shape (d_model, d_k): arrays
W_q, W_k, W_v (W_o, b_q, b_k, b_v, b_o optional) in .npz/.yaml/.json, or a PyTorch state dict
(.pt, read with weights_only=True) of nn.MultiheadAttention (in_proj_weight, out_proj.weight, ...;
q_proj_weight, ... with kdim/vdim) or of a module with nn.Linear layers W_q, W_k, W_v, W_o (d2l)
or q, k, v (the notes): those are transposed. Without --weights, they are drawn from --seed as
PyTorch initialises them (--init mha or linear) and --save records them.

Masks: --valid-lens (d2l), --key-padding-mask (True = ignore that key, as PyTorch), --causal,
--mask (in --mask-convention: nn.MultiheadAttention's boolean attn_mask means True = ignore, so
use --mask-convention drop for it), all shared by every head.

Examples:

  attncli examples show multihead_cat_milk | attncli self -

  attncli self x.npy --weights mha.pt --heads 4 --format json

  attncli self x.npy --memory y.npy --heads 5 --seed 0 --save run.npz
"""



@app.command("self", help=SELF_HELP)
@handles_errors
@takes_options("self")
def self_command(
    problem: ProblemArgs,
    view: View,
    x: Annotated[str | None, typer.Argument(metavar="X", show_default=False,
                                            help="Input (T, D) or (B, T, D): a file, - for stdin, a file with x, "
                                                 "weights, ... entries, or a capture.")] = None,
) -> None:
    from attncli.cli.inputs import build_problem
    from attncli.cli.run import execute
    from attncli.io.files import Reader

    reader = Reader()
    built = build_problem([x] if x is not None else [], problem, reader, multihead=True)
    execute(built, view, protect=[*([x] if x is not None else []), *reader.paths])
