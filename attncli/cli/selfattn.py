"""``attncli self``: self-attention and multi-head attention, step by step."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from attncli.cli import app, handles_errors
from attncli.cli.options import OUTPUT_OPTIONS, PROBLEM_OPTIONS, choices, with_options
from attncli.errors import InputError

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

  attncli self attncli/examples/multihead_cat_milk.yaml

  attncli self x.npy --weights mha.pt --heads 4 --key-padding-mask pad.npy --format json

  attncli self x.npy --memory y.npy --heads 5 --d-k 100 --seed 0 --valid-lens 3,2 --save run.npz
"""

InitChoice = choices("InitChoice", ("mha", "linear"))
OWN = {"weights"}  # shared options this command replaces with its own meaning
SHARED = [p for p in PROBLEM_OPTIONS if p.name not in OWN]
FILE_KEYS = {"x", "memory", "values", "weights", "heads", "labels", "query_labels", "key_labels", "valid_lens",
             "key_padding_mask", "mask", "options", "description", "source", "expected"}
MH = "Multi-head"
# Steps `self` can show without the per-head weights: inputs, projections, head outputs, output.
SELF_OUTPUT_STEPS = {"x", "memory", "values", "q", "k", "v", "head_output", "concat", "output",
                     "W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o"}


@app.command("self", help=SELF_HELP)
@handles_errors
@with_options(SHARED, OUTPUT_OPTIONS)
def self_command(
    x: Annotated[str, typer.Argument(metavar="X", show_default=False,
                                     help="Input (T, D) or (B, T, D): a file, - for stdin, or a file with x, weights, "
                                          "heads, labels, ... entries.")],
    opts: dict[str, Any],
    weights: Annotated[str | None, typer.Option("--weights", "-w", rich_help_panel=MH, show_default=False,
                                                   help="Projection weights: .npz/.yaml/.json (W_q, W_k, W_v, ...; "
                                                        "Q = X @ W_q) or a PyTorch state dict .pt.")] = None,
    heads: Annotated[int | None, typer.Option("--heads", min=1, rich_help_panel=MH, show_default=False,
                                                 help="Number of heads H; must divide d_k and d_v (default 1).")] = None,
    memory: Annotated[str | None, typer.Option("--memory", rich_help_panel=MH, show_default=False,
                                                  help="Cross-attention: keys and values are projected from this "
                                                       "(B, S, D_k) instead of X.")] = None,
    values: Annotated[str | None, typer.Option("--values", rich_help_panel=MH, show_default=False,
                                                  help="Project the values from this (B, S, D_v) instead of the "
                                                       "memory (PyTorch's separate key and value inputs).")] = None,
    key_padding_mask: Annotated[str | None, typer.Option("--key-padding-mask", rich_help_panel=MH, show_default=False,
                                                            help="(B, S) file: True/1 = ignore that key "
                                                                 "(PyTorch key_padding_mask).")] = None,
    d_k: Annotated[int | None, typer.Option("--d-k", min=1, rich_help_panel=MH, show_default=False,
                                               help="Without --weights: width of Q and K (default d_model).")] = None,
    d_v: Annotated[int | None, typer.Option("--d-v", min=1, rich_help_panel=MH, show_default=False,
                                               help="Without --weights: width of V (default d_k).")] = None,
    init: Annotated[InitChoice, typer.Option("--init", rich_help_panel=MH,  # type: ignore[valid-type]
                                             help="Without --weights: mha (nn.MultiheadAttention: xavier, zero "
                                                  "biases) or linear (nn.Linear: uniform ±1/sqrt(fan_in), as d2l).")
                    ] = InitChoice("mha"),  # type: ignore[assignment]
    bias: Annotated[bool, typer.Option("--bias/--no-bias", rich_help_panel=MH,
                                       help="Without --weights: include b_q, b_k, b_v, b_o.")] = True,
    out_proj: Annotated[bool, typer.Option("--out-proj/--no-out-proj", rich_help_panel=MH,
                                           help="Without --weights: apply an output projection W_o.")] = True,
    prefix: Annotated[str | None, typer.Option("--prefix", rich_help_panel=MH, show_default=False,
                                                  help="Module prefix of the attention weights in a bigger state "
                                                       "dict, e.g. encoder.attn.")] = None,
    head: Annotated[int | None, typer.Option("--head", min=0, rich_help_panel=MH, show_default=False,
                                                help="Show only this head's steps in the terminal view "
                                                     "(JSON, NPZ and --save keep every head).")] = None,
    batch_first: Annotated[bool, typer.Option("--batch-first/--no-batch-first", rich_help_panel=MH,
                                              help="Inputs are (B, T, D) (default) or (T, B, D) as PyTorch's "
                                                   "default layout; the steps are always batch-first.")] = True,
) -> None:
    import math
    from dataclasses import replace

    from attncli.cli.inputs import cli_options, parse_valid_lens, split_labels
    from attncli.cli.run import VIEW_CELLS, corner_queries, default_view, emit, output_only, weights_skipped_note
    from attncli.io import Reader
    from attncli.multihead import init_projections, multihead, projections_from, select_head
    from attncli.problem import Options

    if opts.get("threads"):
        from attncli.backend import set_threads

        set_threads(opts["threads"])
    reader = Reader()
    content = reader.read(x)
    src = reader.source(x)
    doc: dict[str, Any] = content if isinstance(content, dict) and "x" in content else {}
    if doc and Path(x).suffix.lower() != ".npz":
        unknown = set(map(str, doc)) - FILE_KEYS
        if unknown:
            raise InputError(f"has unknown entries {', '.join(sorted(unknown))}; a multi-head file holds "
                             f"{', '.join(sorted(FILE_KEYS))}", src)
    sources = {"x": src}

    def entry(spec: str | None, name: str) -> Any:
        if spec is not None:
            sources[name] = reader.source(spec)
            return reader.array(spec, name)
        sources[name] = src
        return doc.get(name)

    X = reader.array(x, "x")
    Y, Z = entry(memory, "memory"), entry(values, "values")
    kpm, mask = entry(key_padding_mask, "key_padding_mask"), entry(opts.get("mask"), "mask")
    valid_lens = doc.get("valid_lens")
    sources["valid_lens"] = src
    if opts.get("valid_lens") is not None:
        valid_lens, sources["valid_lens"] = parse_valid_lens(opts["valid_lens"], reader)

    file_opts = doc.get("options") or {}
    if not isinstance(file_opts, dict):
        raise InputError("'options' must be a mapping of option names to values", src)
    options = Options().merged({str(k).replace("-", "_"): v for k, v in file_opts.items()}, src)
    options = options.merged(cli_options(opts), "command line", flags=True)

    n_heads = heads if heads is not None else doc.get("heads", 1)
    if isinstance(n_heads, bool) or not isinstance(n_heads, int):
        raise InputError(f"'heads' must be a whole number, got {n_heads!r}", src)
    given = [f for f, v in (("--d-k", d_k), ("--d-v", d_v)) if v is not None]
    if given and (weights is not None or "weights" in doc):
        raise InputError("applies only when the weights are initialised (no --weights); "
                         "the widths come from the weights", given[0])
    if weights is not None:
        proj = projections_from(reader.read(weights), reader.source(weights), prefix)
    elif "weights" in doc:
        proj = projections_from(doc, src, prefix)
    else:
        d_q = _width(X, "X", src)
        d_kv = _width(Y, "memory", sources["memory"]) if Y is not None else d_q
        d_vv = _width(Z, "values", sources["values"]) if Z is not None else d_kv
        proj = init_projections(d_q, d_kv, d_vv, d_k=d_k, d_v=d_v, seed=options.seed,
                                init=str(getattr(init, "value", init)), bias=bias, out_proj=out_proj)
    both = split_labels(opts.get("labels")) or _labels(doc.get("labels"))
    qlab = split_labels(opts.get("query_labels")) or _labels(doc.get("query_labels")) or both
    klab = split_labels(opts.get("key_labels")) or _labels(doc.get("key_labels"))
    if klab is None and both is not None and Y is None:
        klab = both
    if output_only(opts, SELF_OUTPUT_STEPS):  # the weights are never held (attncli.fast)
        options = replace(options, keep_weights=False)
    # a big default view: the output for every query, the weights of the rows it shows
    corners = (corner_queries, VIEW_CELLS) if options.keep_weights and default_view(opts) else None
    trace = multihead(X, Y, Z, weights=proj, heads=n_heads, valid_lens=valid_lens, key_padding_mask=kpm, mask=mask,
                      query_labels=qlab, key_labels=klab, options=options, sources=sources, batch_first=batch_first,
                      corners=corners)
    if options.keep_weights and "weights" not in trace:  # too big, and its corner rows could not be computed alone
        keys = trace.step("k").values.shape[-2]
        weights_skipped_note(math.prod(trace.step("head_output").values.shape[:-1]) * keys, opts)
    protect = [p for p in (x, weights, memory, values, key_padding_mask, opts.get("mask")) if p]
    if head is None or opts["format"].value != "rich":
        if head is not None:
            select_head(trace, head)  # still check that the head exists
        emit(trace, opts, protect=protect)
        return
    view = select_head(trace, head)
    if opts.get("save") is not None:  # the file keeps every head; the terminal shows one
        emit(trace, {**opts, "quiet": True, **{k: None for k in ("svg", "html", "plot") if k in opts}}, protect=protect)
    emit(view, {**opts, "save": None}, protect=protect)


def _width(a: Any, title: str, source: str) -> int:
    import numpy as np

    shape = np.shape(a)
    if len(shape) not in (2, 3):
        raise InputError(f"{title} has shape {tuple(shape)}; expected (tokens, features) or (batch, tokens, features)",
                         source)
    return int(shape[-1])


def _labels(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [t.strip() for t in value.split(",")]
    return [str(v) for v in value]
