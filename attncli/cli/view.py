"""``attncli view``: a local viewer of every head of a layer, or of every layer of a model."""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, replace
from typing import Annotated, Any, ClassVar

import typer

from attncli.cli import app, handles_errors
from attncli.cli.options import ProblemArgs, takes_options
from attncli.core.options import VIEWER, option
from attncli.errors import InputError

VIEW_HELP = """Look at every head of a layer in the browser: a local viewer on 127.0.0.1.

The same inputs and options as run (Q [K [V]]) and self (X with --heads, --weights, a checkpoint with \
--layer N). The page shows every head and batch entry as heatmaps, zooms from the whole map down to \
single cells (click one for its arithmetic, a query's label for its row), every step (scores, \
scaled, masked, weights, ...), and a head view (lines from each query to the keys it attends) up \
to 512 tokens. With --layer all, HIDDEN holds the hidden states of every layer (stacked \
(layers + 1, [batch,] T, E), or an .npz with members 0, 1, ...) and the page starts with the \
model view: layers × heads.

The server listens on 127.0.0.1 only and answers only requests with the random token of the URL it \
prints; it is read-only, and stops on Ctrl-C. Memory stays bounded: the weights are computed a block \
of queries at a time; an overview of each step is kept (at most 512 × 512 values per head) and at \
most 256 MB of exact rows.

Examples:

  attncli examples show multihead_cat_milk | attncli view - --no-open

  attncli view q.npy k.npy v.npy --causal

  attncli view x.npy --weights MODEL_FOLDER --layer 3 --from-residual

  attncli view hidden.npz --weights MODEL_FOLDER --layer all --from-residual --no-open
"""

@dataclass(frozen=True)
class Serve:
    """The viewer's own options."""

    COMMANDS: ClassVar[frozenset[str]] = frozenset({"view"})

    port: int = option(0, "Port on 127.0.0.1 (default 0: a free one).", VIEWER, min=0, max=65535)
    open: bool = option(True, "Open the page in the browser.", VIEWER, off="--no-open")


@app.command("view", help=VIEW_HELP)
@handles_errors
@takes_options("view")
def view_command(
    problem: ProblemArgs,
    serving: Serve,
    inputs: Annotated[list[str] | None, typer.Argument(metavar="Q [K [V]] | X | HIDDEN | CAPTURE", show_default=False,
                                                       help="Input files, or - for stdin (none with --text).")] = None,
) -> None:
    from attncli.cli.inputs import build_problem
    from attncli.io.files import Reader

    reader = Reader()
    layer = problem.layer
    inputs = list(inputs or [])
    if layer is not None and layer.strip().lower() == "all":
        layers, model = model_layers(inputs, replace(problem, layer=None), reader), True
    else:
        built = build_problem(inputs, problem, reader)
        layers, model = [(f"layer {layer}" if layer is not None else "attention", built)], False
    said, named = checked(layers)
    serve(layers, model, serving.port, serving.open, said, named)


def verified(layers: list[tuple[str, Any]]) -> str:
    """Each layer built from a capture, compared with the model's own attention (a difference beyond the bound is
    refused in one line, unless --keep-going): what the viewer's header says of it ('' when nothing was)."""
    return checked(layers)[0]


def checked(layers: list[tuple[str, Any]]) -> tuple[str, list[list[dict[str, Any]]]]:
    """What ``verified`` says, and per layer the heads that pass a pattern (the diagnostics' ``head_patterns`` of
    ``self`` on the same layer, by attncli.cli.run.name_heads on the same trace; [] for a layer not run here: one
    not from a capture, or one whose capture kept no attention of the model's own, beyond its budget)."""
    from attncli.cli.inputs import agreement, captured
    from attncli.cli.run import name_heads
    from attncli.core.engine import run

    said = []
    named: list[list[dict[str, Any]]] = []
    for _, p in layers:
        c = captured(p)
        heads: list[dict[str, Any]] = []
        if c is not None and c.own is not None:
            trace = run(p)
            a = agreement(p, trace)
            if a is not None:
                said.append(a)
            name_heads(p, trace)
            heads = list(trace.extra.get("head_patterns", []))
        named.append(heads)
    return summary(said), named


def summary(said: list[Any]) -> str:
    """The header's line on how the layers compare with the model's own attention ('' when none was)."""
    if not said:
        return ""
    if len(said) == 1:
        return said[0].line()
    worst = max(a.max_abs_diff for a in said)
    differ = [a.layer for a in said if not a.agrees]
    if differ:
        return f"layers {', '.join(map(str, differ))} DIFFER from the model's own attention (shown with --keep-going)"
    return f"{len(said)} layers agree with the model's own attention, max |Δ| {worst:.1e}"


def model_layers(inputs: list[str], opts: ProblemArgs, reader: Any) -> list[tuple[str, Any]]:
    """Every layer's problem: X of layer l is HIDDEN[l] (stacked (L + 1, [B,] T, E), or an .npz with
    members 0, 1, ...), with the checkpoint's layer l."""
    import numpy as np

    from attncli.cli.inputs import build_problem, from_capture, text_capture, wants_text
    from attncli.io.capture import capture_from, is_capture
    from attncli.io.files import Reader

    cap = text_capture(opts) if wants_text(opts) else None
    if cap is None and len(inputs) == 1 and is_capture(reader.read(inputs[0])):
        cap = capture_from(reader.read(inputs[0]), reader.source(inputs[0]))
    if cap is not None:  # every layer the capture holds the input of
        plain = replace(opts, text=None, text_file=None)
        stack = cap.decoder if opts.prefix is not None and "decoder" in opts.prefix and cap.decoder else cap.stack
        kept = stack.state_layers or range(stack.hidden_states.shape[0] - 1)
        return [(f"layer {i}", from_capture(inputs, replace(plain, layer=str(i)), reader, cap)) for i in kept]
    if len(inputs) != 1:
        raise InputError("--layer all takes one input: HIDDEN, the hidden states of every layer", "arguments")
    if opts.weights is None:
        raise InputError("needs a checkpoint: --weights MODEL_FOLDER (or .safetensors)", "--layer")
    spec = inputs[0]
    content = reader.read(spec)
    if isinstance(content, dict):
        names = sorted((k for k in map(str, content) if k.isdigit()), key=int)
        if not names or names != [str(i) for i in range(len(names))]:
            raise InputError("an .npz of hidden states holds members 0, 1, ... (one per layer, and the last output)",
                             reader.source(spec))
        states = [np.asarray(content[k]) for k in names]
    else:
        a = np.asarray(content)
        if a.ndim not in (3, 4):
            raise InputError(f"hidden states are stacked (layers + 1, [batch,] T, E); got shape {a.shape}",
                             reader.source(spec))
        states = list(a)
    count = len(states) - 1 if len(states) > 1 else 1  # hidden_states: the input of each layer, then the output
    slices = {f"{spec}[{i}]": states[i] for i in range(count)}

    class Slices(Reader):
        """The reader of the run, that also knows HIDDEN[l] by name."""

        def read(self, spec: str, cap: int | None = None) -> Any:
            return slices[spec] if spec in slices else reader.read(spec, cap)

        def source(self, name: str) -> str:
            return name if name in slices else reader.source(name)

    out = []
    for i, name in enumerate(slices):
        out.append((f"layer {i}", build_problem([name], replace(opts, layer=str(i)), Slices(), multihead=True)))
    return out


def viewer_layers(layers: list[tuple[str, Any]], named: list[list[dict[str, Any]]] | None = None) -> list[Any]:
    """The viewer's layers, each with its named heads (``named``: the diagnostics' ``head_patterns``) and, for a
    layer built from a capture, the capture's positions (token ids, special tokens), so that the model view's
    badges are measured as ``self`` and ``heads`` measure them (induction and special included)."""
    from attncli.cli.inputs import captured
    from attncli.cli.run import capture_sequences
    from attncli.render.viewer import Layer

    computed = [Layer(p, name) for name, p in layers]
    for layer, (_, p) in zip(computed, layers):
        c = captured(p)
        if c is not None:
            layer.sequences = capture_sequences(c)
    for layer, heads in zip(computed, named or []):
        layer.named = heads
    return computed


def serve(layers: list[tuple[str, Any]], model: bool, port: int, open_browser: bool, said: str = "",
          named: list[list[dict[str, Any]]] | None = None) -> None:
    """Start the viewer, print its URL, open it, and serve until Ctrl-C (then exit 0). ``said``: how the layers
    compare with the model's own attention (a capture's), for the header; ``named``: per layer, its named heads
    (the diagnostics' ``head_patterns``)."""
    import secrets

    from attncli.render.viewer import Server, Viewer

    computed = viewer_layers(layers, named)
    viewer = Viewer(computed, secrets.token_urlsafe(24), model=model,
                    title="attncli view: " + ("model" if model else layers[0][0]) + (f" · {said}" if said else ""))
    try:
        server = Server(viewer, port)
    except OSError as e:
        raise InputError(f"cannot listen on 127.0.0.1:{port} ({e.strerror or e})", "--port") from None
    viewer.start()
    url = server.url()
    sys.stdout.write(f"attncli view: {url}\n(Ctrl-C stops it)\n")
    sys.stdout.flush()
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: stop serving, exit 0
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        sys.stderr.write("attncli: viewer stopped\n")
    finally:
        signal.signal(signal.SIGINT, previous)
        server.server_close()
