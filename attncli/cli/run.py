"""``attncli run``: attention on the given Q, K, V, step by step."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from attncli.cli import app, handles_errors, warn
from attncli.cli.options import ProblemArgs, View, takes_options
from attncli.errors import InputError

RUN_HELP = """Compute attention on Q, K, V and show every step.

Inputs are .npy, .npz, .yaml/.yml, .json, .csv/.txt, .pt files, or - for stdin. One input is a \
problem file (q, k, v, labels, valid_lens, mask, options) or a matrix used as Q, K and V; \
two are Q and K (K is also V); three are Q, K, V.

Examples:

  attncli examples show cat_milk_sweet | attncli run -

  attncli run --score scaled-dot q.npy k.npy v.npy --valid-lens 2,3

  attncli run q.yaml k.yaml v.yaml --format json | jq .output
"""


@app.command("run", help=RUN_HELP)
@handles_errors
@takes_options("run")
def run_command(
    inputs: Annotated[list[str], typer.Argument(metavar="Q [K [V]]", help="Input files, or - for stdin.",
                                                show_default=False)],
    problem: ProblemArgs,
    view: View,
) -> None:
    from attncli.cli.inputs import build_problem
    from attncli.io.files import Reader

    reader = Reader()
    built = build_problem(inputs, problem, reader)
    execute(built, view, protect=[*inputs, *reader.paths])  # --mask, --valid-lens, --weights files too


def execute(problem: Any, opts: View, protect: list[str]) -> None:
    """Plan what the options need, run the pipeline, and show or save the trace (``--head``: one head
    in the terminal view, every head in the files). A page or a plot beyond what a trace of every weight
    holds is made first, from blocks of queries, and written last (nothing is written when the run fails)."""
    picture_options(opts)  # every picture option checked before anything is computed
    made: list[tuple[Path, bytes]] = []
    if opts.html is not None:
        from attncli.render.bigpage import page_for_problem  # here: only a page needs it (and its viewer code)

        text = page_for_problem(problem, list(opts.explain or []), list(opts.explain_row or []), opts.precision)
        if text is not None:  # beyond a page of tables: written from blocks of queries, never all weights
            made.append((opts.html, text.encode()))
            opts = replace(opts, html=None)
    if opts.plot is not None:
        data = big_plot(problem, opts)
        if data is not None:
            made.append((opts.plot, data))
            opts = replace(opts, plot=None)
    if not (made and page_was_all(opts, problem)):
        compute_and_emit(problem, opts, protect)
    elif opts.steps:  # the steps of a page made from blocks, nothing else shown: named ones checked on one query row
        from attncli.core.engine import run
        from attncli.core.plan import Plan

        known_steps(run(problem, Plan("explicit", (0,))), opts.steps)
    if made:
        from attncli.io.files import atomic_write

        for path, data in made:
            with atomic_write(path, protect=protect) as f:
                f.write(data)


def big_plot(problem: Any, opts: View) -> bytes | None:
    """--plot of a problem whose maps are larger than their panels, drawn from blocks of queries; None when
    the maps fit (drawn from the trace)."""
    import io

    from attncli.render.bigplot import plot_problem
    from attncli.render.plot import PLOT_FORMATS

    assert opts.plot is not None
    buf = io.BytesIO()
    drawn = plot_problem(problem, buf, PLOT_FORMATS[opts.plot.suffix.lower()], picture_options(opts).plot)
    return None if drawn is None else buf.getvalue()


def compute_and_emit(problem: Any, opts: View, protect: list[str]) -> None:
    """The run the options need (see attncli.core.plan), shown and saved."""
    from attncli.cli.inputs import agreement
    from attncli.core.engine import run, select_head
    from attncli.core.plan import Needs, plan

    needs = Needs(weights=not output_only(opts), view_rows=corner_queries if default_view(opts) else None)
    how = plan(problem, needs)
    with progress_bar(opts.quiet) as progress:
        trace = run(problem, how, progress=progress)
    said = agreement(problem, trace)  # a capture's layer: compared with the model's own attention (or refused)
    name_heads(problem, trace)
    first = None
    if said is not None and not opts.quiet:
        if not said.agrees:
            warn(said.line() + " (shown with --keep-going)")
        else:
            first = said.line()  # the text view's first line
    if how.skipped:
        weights_skipped_note(how.skipped, opts)
    head = opts.head
    if head is None:
        emit(trace, opts, protect=protect, first=first)
        return
    view = select_head(trace, head)  # also checks that the head exists
    if opts.format != "rich":
        emit(trace, opts, protect=protect, first=first)
        return
    if opts.save is not None:  # the file keeps every head; the terminal shows one
        emit(trace, replace(opts, quiet=True, svg=None, html=None, plot=None), protect=protect)
    emit(view, replace(opts, save=None), protect=protect, first=first)


def capture_sequences(c: Any) -> tuple[list[Any], list[Any] | None]:
    """What a capture says of a layer's positions, per entry (attncli.core.headstats.Sequence): its valid tokens,
    token ids, special tokens and punctuation; for the queries, and for the keys when they are another sequence
    (cross-attention: (queries without ids, keys with the encoder's special tokens)). ``c``: ``captured(problem)``."""
    import numpy as np

    from attncli.core import headstats as hs

    vq, vk = (np.asarray(v, dtype=bool) for v in c.valid)
    cap = c.capture
    cross = c.query_labels != c.key_labels or vq.shape != vk.shape
    stack = cap.stack
    if not cross and cap.decoder is not None and [list(r) for r in cap.decoder.labels] == c.query_labels \
            and [list(r) for r in stack.labels] != c.query_labels:
        stack = cap.decoder
    special = cap.special_tokens_mask if stack is cap.stack else None

    def seqs(valid: Any, labels: list[list[str]], ids: Any, spec: Any) -> list[hs.Sequence]:
        return [hs.Sequence(valid[b], None if ids is None else np.asarray(ids[b]),
                            None if spec is None else np.asarray(spec[b]) != 0,
                            np.array([hs.is_punctuation(t) for t in labels[b]], dtype=bool))
                for b in range(valid.shape[0])]

    if cross:
        return seqs(vq, c.query_labels, None, None), seqs(vk, c.key_labels, None, cap.special_tokens_mask)
    return seqs(vq, c.query_labels, stack.input_ids, special), None


def name_heads(problem: Any, trace: Any) -> None:
    """A layer computed from a capture (or --text): the heads that pass a pattern of ``heads`` (its thresholds and
    definitions, from the trace's own weights, valid queries only), kept for the diagnostics
    (``trace.extra['head_patterns']``). Nothing when the trace holds only some rows or the model has sinks."""
    from attncli.cli.inputs import captured

    c = captured(problem)
    if c is None or "weights" not in trace:
        return
    import numpy as np

    from attncli.core import headstats as hs  # only for a capture: a plain run imports none of them (start-up)
    from attncli.core.diagnostics import masked_cells
    from attncli.io.capture import visible

    w = np.asarray(trace["weights"], dtype=np.float64)
    vq, vk = (np.asarray(v, dtype=bool) for v in c.valid)
    if w.ndim == 3:
        w = w[None]
    if w.ndim != 4 or w.shape[0] != vq.shape[0] or w.shape[2:] != (vq.shape[1], vk.shape[1]):
        return  # some rows only (the corners of a big view), or a shape this does not know
    queries, keys = capture_sequences(c)
    firsts = {row[int(np.argmax(v))] for row, v in zip(c.key_labels, vk) if v.any()}
    first = visible(next(iter(firsts))) if len(firsts) == 1 else None  # as the views show a token (␣ cat)
    rows = w.sum(axis=-1)[vq[:, None].repeat(w.shape[1], axis=1)]
    if not np.allclose(rows, 1.0, atol=1e-6):
        return  # rows that do not sum to 1 (a sink's share): not weights the patterns are defined on here
    hidden = masked_cells(trace)
    if hidden is not None:
        hidden = np.asarray(hidden)
        hidden = hidden[None] if hidden.ndim == 3 else hidden
        if hidden.ndim != 4 or any(x not in (1, y) for x, y in zip(hidden.shape, w.shape)):
            hidden = None  # not the weights' cells: every 0 taken as masked
    trace.extra["head_patterns"] = hs.name_heads(w, queries, first, keys, masked=hidden)


def page_was_all(opts: View, problem: Any) -> bool:
    """Whether nothing but the pictures already made was asked for: --quiet, the terminal format, nothing
    else saved or drawn, and no capture whose model attention the run must agree with. Then --explain /
    --explain-row were the page's, and the run (every weight, for them) is not made; --steps, which only choose what
    is shown or saved, are checked (:func:`known_steps`) and change nothing here."""
    from attncli.cli.inputs import captured

    return (opts.quiet and opts.format == "rich" and opts.save is None
            and not (opts.svg or opts.plot or opts.similarity) and captured(problem) is None)


OUTPUT_ONLY_STEPS = {"q", "k", "v", "output", "x", "memory", "values", "head_output", "concat",
                     "W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o", "W_g", "gate", "gated"}
PROGRESS_AFTER = 1.0  # seconds a run takes before its progress bar appears


def output_only(opts: View, allowed: set[str] = OUTPUT_ONLY_STEPS) -> bool:
    """Nothing but the output is asked for: --steps names only it (and inputs, projections, or other
    steps that need no weights), or --save FILE.npy with the terminal view (JSON and NPZ on stdout
    always carry the weights)."""
    if opts.needs_weights():
        return False
    if opts.steps:
        return {s.strip() for s in opts.steps.split(",")} <= allowed
    save = opts.save
    return save is not None and save.suffix.lower() == ".npy" and opts.format == "rich"


def default_view(opts: View) -> bool:
    """Whether ``opts`` ask for the default terminal view only: no --steps, nothing saved or drawn
    from the weights."""
    if opts.steps or opts.format != "rich" or opts.needs_weights():
        return False
    save = opts.save
    return save is None or save.suffix.lower() == ".npy"


def corner_queries(m: int) -> list[int]:
    """The queries the terminal view shows of ``m``: its first and last rows."""
    from attncli.render import RenderOptions
    from attncli.render.terminal import shown

    return [i for i in shown(m, RenderOptions().max_rows, False) if i is not None]


def weights_skipped_note(cells: int, opts: View) -> None:
    """Say on stderr that a big view shows no weights (its corner rows could not be computed alone)."""
    if not opts.quiet:
        sys.stderr.write(f"attncli: note: the {cells:,} attention weights are not computed for the step-by-step "
                         "view (only their corners would show); it shows the inputs and the output. Ask for them "
                         "with --steps weights,output or --save FILE.npz\n")


@contextmanager
def progress_bar(quiet: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress callback that shows a rich bar on stderr once the run has taken PROGRESS_AFTER
    seconds; None (no bar) with --quiet or when stderr is not a terminal."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    start = time.monotonic()
    bar: Any = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            if time.monotonic() - start < PROGRESS_AFTER:
                return
            from rich.console import Console
            from rich.progress import Progress

            bar = Progress(console=Console(stderr=True), transient=True)
            bar.start()
            bar.add_task("attention (queries)", total=total)
        bar.update(bar.task_ids[0], completed=done)

    try:
        yield update
    finally:
        if bar is not None:
            bar.stop()


def picture_options(opts: View) -> Any:
    """The typed picture options (attncli.render.pictures.Pictures) from the flags. Checked on creation."""
    from attncli.render.pictures import Pictures
    from attncli.render.plot import DPI, PlotOptions, parse_figsize

    steps = [s.strip() for s in str(opts.plot_steps or "weights").split(",") if s.strip()]
    return Pictures(svg=opts.svg, html=opts.html, plot_path=opts.plot,
                    plot=PlotOptions(steps=steps, vmin=opts.vmin, vmax=opts.vmax,
                                     dpi=opts.dpi or DPI, figsize=parse_figsize(opts.figsize)),
                    theme=opts.theme or "dark", width=opts.width or 100)


def pictures(trace: Any, opts: View, ropts: Any) -> Any:
    """Diagnostics, explanations and the picture options, all checked before anything is printed."""
    from attncli.core.diagnostics import attach as diagnose
    from attncli.render.explain import attach as explain

    show = picture_options(opts)
    shown = (opts.format == "rich" and not opts.quiet) or opts.format == "json"
    saved = opts.save is not None and opts.save.suffix.lower() == ".json"
    sim = opts.similarity
    document = opts.format in ("latex", "markdown")
    if shown or saved or show.wanted or sim is not None or document:  # nobody reads diagnostics of an NPZ-only run
        diagnose(trace, sim)
    explain(trace, ropts)
    show.check(trace)
    return show


def known_steps(trace: Any, given: str) -> list[str]:
    """The steps --steps names, each one of ``trace``'s (or its inputs); else an InputError naming the unknown."""
    steps = [s.strip() for s in given.split(",")]
    known = {*trace.names(), *trace.inputs}
    unknown = [s for s in steps if s not in known]
    if unknown:
        raise InputError(f"unknown step(s) {', '.join(unknown)}; this run has {', '.join([*trace.inputs, *trace.names()])}",
                         "--steps")
    return steps


def emit(trace: Any, opts: View, protect: list[str], first: str | None = None) -> None:
    """Print the trace in the chosen format, save it if asked, and report warnings on stderr. ``first``: a line the
    text view starts with (a capture's layer against the model's own attention), once everything is checked."""
    from rich.console import Console

    from attncli.io.files import atomic_write
    from attncli.render import FORMATS, SAVERS, RenderOptions, load_renderers

    load_renderers()
    steps = known_steps(trace, opts.steps) if opts.steps else None
    ropts = RenderOptions(precision=opts.precision, steps=steps, full=opts.full,
                          explain=list(opts.explain or []), explain_rows=list(opts.explain_row or []))
    show = pictures(trace, opts, ropts)
    save: Path | None = opts.save
    if save is not None:
        ext = save.suffix.lower()
        if ext not in SAVERS:
            raise InputError(f"cannot save as {ext or '(no extension)'!r}; use one of {', '.join(sorted(SAVERS))}",
                             str(save))
        with atomic_write(save, protect=protect) as f:
            SAVERS[ext](trace, ropts, f)
    fmt = opts.format
    if fmt == "rich":
        if not opts.quiet:
            # labels are text: no markup, no :emoji: codes
            console = Console(soft_wrap=False, markup=False, emoji=False)
            if first is not None:
                console.print(first, highlight=False, soft_wrap=True)  # one line, whatever the width
            FORMATS["rich"](trace, ropts, console)
    else:
        FORMATS[fmt](trace, ropts, sys.stdout)
        sys.stdout.flush()
    show.write(trace, lambda console: FORMATS["rich"](trace, ropts, console), protect)
    if not opts.quiet:
        for w in trace.warnings:
            warn(w)  # one line: a file name or label in it is escaped
