"""``attncli check``: compare expected numbers with the computed ones and name the mistake.

Arguments: ``[EXPECTED] Q [K [V]]``.

- With ``--expected`` (inline numbers like ``"[[0.625, 1.375], ...]"``, or a file), every
  argument is an input, exactly as for ``run``.
- Without it, the first argument is the EXPECTED file and the rest are the inputs; a single
  argument is a problem file with an ``expected:`` entry (expected numbers beside q, k, v).

Exit codes, like cmp/diff: 0 match (or consistent with the precision), 1 mismatch (whether
or not a mistake is named), 2 bad input or usage, 70 an internal error (one line on stderr,
'attncli: error: internal error ...'). A mismatch prints its verdict (first line 'MISMATCH',
or ``"verdict": "mismatch"`` in JSON); with ``--format json`` an error prints
``{"verdict": "error" | "internal-error", "errors": [...]}`` -- except a refusal of check's own options
(--what, --atol, --rtol, --precision-of, --explain, --format, ...: their values, or their use with these inputs),
which, in every format, writes nothing on stdout (:func:`refuses_own_option`).
"""

from __future__ import annotations

import difflib
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

if TYPE_CHECKING:
    import numpy as np
else:
    from attncli.lazy import numpy as np  # imported on first use: `attncli --help` needs none

import typer

from attncli.cli import EXIT_OK, app, error, handles_errors
from attncli.cli.options import ProblemArgs, takes_options
from attncli.core.backend import PRECISIONS
from attncli.core.options import CHECK, option
from attncli.errors import AttnError, InputError
from attncli.render.check import CHECK_FORMATS

EXIT_MISMATCH = 1
EXIT_INTERNAL_ERROR = 70  # EX_SOFTWARE (sysexits.h)


@dataclass(frozen=True)
class Verify:
    """What to compare and how to report it: ``check``'s own options."""

    COMMANDS: ClassVar[frozenset[str]] = frozenset({"check"})

    expected: str | None = option(
        None, "Expected numbers inline, e.g. \"[[0.625, 1.375], [0.089, 1.911]]\" (YAML/JSON list), or a file; "
              "then every argument is an input.", CHECK, short="-e", essential=True)
    what: str | None = option(
        None, "The step to compare: output, weights, scores, or any step of `attncli run` (default: every step a "
              "problem file's `expected:` names, each with its own verdict; else the output).", CHECK,
        essential=True)
    atol: float | None = option(
        None, "Absolute tolerance (default: half a unit of the last decimal the expected numbers are written with; "
              "for binary files and whole numbers, torch.testing's float default).", CHECK, min=0.0)
    rtol: float | None = option(
        None, "Relative tolerance: cells match when |expected - computed| <= atol + rtol·|computed|.", CHECK,
        min=0.0)
    precision_of: str | None = option(
        None, "The expected numbers come from an implementation in this precision (e.g. a bfloat16 kernel): compare "
              "them with the float64 reference and judge the error against what plain arithmetic in that precision "
              "gives (at most 2×, as FlashAttention's tests). Default: the expected file's own dtype when it is "
              "float16 or bfloat16.", CHECK, choices=lambda: PRECISIONS)
    pairs: bool = option(
        True, "When no single mistake of the catalogue reproduces the numbers, try two together (default on).", CHECK)
    search: bool = option(
        True, "On a mismatch, try the catalogue of known variants and mistakes (default on).", CHECK,
        flag="--search")
    format: str = option(
        "rich", "rich: a report; json: one JSON object on stdout (verdict, errors, explanations).", CHECK, short="-f",
        essential=True, choices=lambda: list(CHECK_FORMATS))  # the check renderers' registry
    precision: int = option(4, "Decimals shown in the report.", CHECK, short="-p", min=0, max=17)
    explain: tuple[str, ...] = option(
        (), "After the verdict, explain one score and weight cell of the computed attention (as `run --explain`): "
            "QUERY,KEY by labels (it,milk) or indices (2,1), BATCH:QUERY,KEY when batched (0:2,1). Repeatable.",
        CHECK, short="-x")
    quiet: bool = option(False, "Print nothing; only the exit code tells (as cmp -s).", CHECK, short="-q")


CHECK_HELP = (
    "Compare expected numbers with the computed attention, and name the mistake if they differ.\n\n"
    "Arguments: EXPECTED, then the inputs as for `run` (Q [K [V]] or a problem file). With --expected, every "
    "argument is an input. A problem file alone may carry its own `expected:` numbers (an array, or one per "
    "step: output, weights, scores).\n\n"
    "EXPECTED is .yaml/.json/.csv/.txt (the tolerance comes from the decimals written there), .npy/.npz "
    "(float defaults), or - for stdin.\n\n"
    "Exit codes: 0 match, 1 mismatch (a verdict on stdout), 2 bad input, 70 an internal error.\n\n"
    "Examples:\n\n"
    "  attncli examples show cat_milk_sweet | attncli check - --what weights\n\n"
    "  attncli check -e \"[[0.5, 0.5], [0.25, 0.75]]\" q.npy k.npy --what weights\n\n"
    "  attncli check expected.npy q.npy k.npy v.npy --valid-lens 2,3 --format json\n\n"
    "  attncli check kernel_out.pt q.pt k.pt v.pt --causal --precision-of bfloat16\n\n"
    "  attncli check expected.npy q.npy k.npy v.npy -x 1,2\n"
)

INLINE = "--expected"
EXPLAIN_CELLS = 1 << 22  # score cells (batch × m × n) beyond which --explain computes its cells' rows alone


@app.command("check", help=CHECK_HELP)
@handles_errors
@takes_options("check")
def check_command(
    problem: ProblemArgs,
    opts: Verify,
    args: Annotated[list[str] | None, typer.Argument(
        metavar="[EXPECTED] Q [K [V]]", show_default=False,
        help="Expected numbers (unless --expected), then the input files (or a capture).")] = None,
) -> None:
    args = list(args or [])
    fmt = opts.format
    own_options(problem, opts)  # check's own options refused: one line on stderr, nothing on stdout (every format)
    try:
        verdict, cells = compute_verdict(args, problem, opts)
    except AttnError as e:
        if fmt == "json" and not opts.quiet and not refuses_own_option(e):
            _print_error("error", str(e))
        raise
    except Exception as e:  # also MemoryError: exit 70, one line
        if os.environ.get("ATTNCLI_DEBUG"):
            raise
        if fmt == "json" and not opts.quiet:
            _print_error("internal-error", f"{type(e).__name__}: {e}")
        error(f"internal error: {type(e).__name__}: {' '.join(str(e).split())[:300]} "
              "(set ATTNCLI_DEBUG=1 for the traceback, and please report it)")
        raise typer.Exit(EXIT_INTERNAL_ERROR) from None
    if not opts.quiet:
        if fmt == "rich":
            from rich.console import Console

            from attncli.render.check import print_cells

            console = Console(soft_wrap=False, markup=False, emoji=False)
            CHECK_FORMATS[fmt](verdict, opts.precision, console)
            print_cells(cells, console)
        elif cells:  # JSON: the cells' arithmetic beside the verdict
            from attncli.render.check import verdict_json

            sys.stdout.write(verdict_json({**verdict.to_dict(), "cells": cells}) + "\n")
            sys.stdout.flush()
        else:
            CHECK_FORMATS[fmt](verdict, opts.precision, sys.stdout)
            sys.stdout.flush()
    raise typer.Exit(EXIT_OK if verdict.match else EXIT_MISMATCH)


def _print_error(kind: str, message: str) -> None:
    from attncli.render.check import verdict_json

    sys.stdout.write(verdict_json({"verdict": kind, "match": False, "errors": [" ".join(message.split())]}) + "\n")
    sys.stdout.flush()


def STEP_NAMES() -> list[str]:  # noqa: N802  (a constant, read when needed)
    """Every step any computation records (attncli.core.trace.StepName): what --what may name."""
    from attncli.core.trace import StepName

    return [n.value for n in StepName]


class OptionRefused(InputError):
    """A refusal of check's own option that is named by the flag of its data (--expected): its use with these
    inputs, not the numbers it gives."""


def refuses_own_option(e: AttnError) -> bool:
    """Whether ``e`` refuses one of check's own options (its value, or its use with these inputs): named by its flag
    (attncli.core.options declares them: --what, --atol, --explain, ...). Then nothing is written on stdout, in every
    format; --expected's culprit is its numbers (an input) unless the refusal is of the option itself."""
    from attncli.core.options import declared

    source = getattr(e, "source", None)
    own = {o.long for o in declared(Verify).values()} - {INLINE}
    return source in own or isinstance(e, OptionRefused)


def own_options(problem: ProblemArgs, opts: Verify) -> dict[str, float]:
    """``check``'s own options, refused before anything is read (the command then writes nothing on stdout, in
    every format: as typer's own refusals of them): the tolerances given, as numbers."""
    if opts.what is not None and opts.what not in STEP_NAMES():
        close = difflib.get_close_matches(opts.what, STEP_NAMES(), 1, cutoff=0.85)
        raise InputError(f"no computation has a step {opts.what!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                         + "; steps are e.g. output, weights, softmax, masked, scaled, scores, q_rot, head_output "
                         "(`attncli run ... --format json` lists a problem's)", "--what")
    given: dict[str, float] = {f: float(v) for f, v in (("atol", opts.atol), ("rtol", opts.rtol)) if v is not None}
    for name, x in given.items():
        if not (math.isfinite(x) and x >= 0):
            raise InputError(f"must be a finite number >= 0, got {x:g}", f"--{name}")
    if opts.precision_of is not None and given:
        raise InputError("--precision-of judges the error against the precision's own; give it or --atol/--rtol, "
                         "not both", "--precision-of")
    if problem.layer is not None and problem.layer.strip().lower() == "all" and opts.explain:
        raise InputError("is not offered with --layer all (which layer's cell?); check one layer with "
                         "--layer N to explain its cells", "--explain")
    return given


def compute_verdict(args: list[str], problem: ProblemArgs, opts: Verify) -> tuple[Any, list[dict[str, Any]]]:
    """Split the arguments, read the expected numbers and the problem, and check: (the verdict, the arithmetic of
    the cells ``--explain`` names, each as ``run --explain`` gives it)."""
    from attncli.check.verdict import Steps, absent_step, check, default_judgement
    from attncli.cli.inputs import build_problem
    from attncli.core.engine import run
    from attncli.core.plan import Needs, plan
    from attncli.io.files import Reader
    from attncli.render import RenderOptions
    from attncli.render.explain import explanations

    reader = Reader()  # reads stdin once, bounded, and keeps the text of each input (for the precision)
    given = own_options(problem, opts)
    captured = capture_verdict(args, problem, opts, reader)
    if captured is not None:
        return captured, []
    if problem.layer is not None and problem.layer.strip().lower() == "all":
        return check_all_layers(args, problem, opts, reader, given), []
    spec, inputs = split_arguments(args, opts.expected, reader)
    steps = [opts.what] if opts.what is not None else expected_steps(spec, reader) or ["output"]
    subject = build_problem(inputs, problem, reader)
    absent = None if opts.what is None else absent_step(subject, opts.what)
    if absent is not None:  # refused before computing: the chain's stages tell
        raise InputError(absent, "--what")
    weights = steps != ["output"]
    rowwise = bool(opts.explain) and not weights and math.prod(subject.batch_shape) * subject.m * subject.n > EXPLAIN_CELLS
    # the output alone (and no cell to explain, or a problem whose cells are explained a row at a time): no (m, n) matrix
    trace = run(subject, plan(subject, Needs(weights=weights or (bool(opts.explain) and not rowwise))))
    if rowwise:
        cells = row_explanations(subject, list(opts.explain), opts.precision)  # checked first
    else:
        cells = explanations(trace, RenderOptions(precision=opts.precision, explain=list(opts.explain or [])))
    verdicts = []
    for what in steps:  # each expected step of a problem file, in the file's order: its own verdict
        if what not in trace:  # a step outside the chain (absent_step told the chain's): --what's, or the file's
            raise InputError(f"{'' if opts.what else 'expected: names '}the step {what!r}, which this computation does "
                             f"not have; it has {', '.join(trace.names())}",
                             "--what" if opts.what else reader.source(spec or INLINE))
        expected, written, source, half = read_expected(spec, opts.expected, reader, what)
        tol, precision, precision_source = default_judgement(expected, written, half, str(trace.meta.dtype),
                                                             source, given, opts.precision_of)
        verdicts.append(check(subject, expected, what=what, tolerance=tol, trace=trace, source=source,
                              explain=opts.search, precision=precision, precision_source=precision_source,
                              pairs=opts.pairs))
    return (verdicts[0] if len(verdicts) == 1 else Steps(verdicts)), cells


def row_explanations(subject: Any, specs: list[str], precision: int) -> list[dict[str, Any]]:
    """The cells ``--explain`` names, as :func:`attncli.render.explain.explanations` gives them, each computed from
    its query's row alone (the viewer's rows on demand): what ``check -x`` explains beyond ``EXPLAIN_CELLS``."""
    from attncli.render.explain import parse_cell
    from attncli.render.viewer import Layer

    layer = Layer(subject, "attention")
    shape = layer.row_trace(0)  # the problem's shape and labels, to parse QUERY,KEY
    asked = [(spec, parse_cell(shape, spec, precision)) for spec in specs]  # every cell checked before any is explained
    return [{"what": "cell", "spec": spec, "batch": list(c.batch), "query": c.i, "key": c.j,
             **layer.explain(c.batch, c.i, c.j, precision)} for spec, c in asked]


def capture_verdict(args: list[str], problem: ProblemArgs, opts: Verify, reader: Any) -> Any:
    """``check CAPTURE --weights MODEL --layer N|all`` (or ``--text``): each layer recomputed from the capture's
    residual stream against the model's own attention weights it holds, judged as check judges numbers of the
    capture's dtype; None when the input is no capture."""
    from dataclasses import replace

    from attncli.check.layers import LayerVerdicts
    from attncli.check.model import model_attention
    from attncli.cli.inputs import captured, from_capture, text_capture, wants_text
    from attncli.core.engine import run
    from attncli.io.capture import capture_from, is_capture

    if wants_text(problem):
        cap = text_capture(problem)
    elif len(args) == 1 and opts.expected is None and is_capture(reader.read(args[0])):
        cap = capture_from(reader.read(args[0]), reader.source(args[0]))
    else:
        return None
    for flag, value in (("--expected", opts.expected), ("--what", opts.what not in (None, "weights")),
                        ("--precision-of", opts.precision_of), ("--explain", bool(opts.explain))):
        if value:
            raise OptionRefused("is not offered with a capture: its layers are checked against the model's own attention "
                                "weights it holds", flag)
    plain = replace(problem, text=None, text_file=None)
    every = problem.layer is not None and problem.layer.strip().lower() == "all"
    stack = cap.decoder if problem.prefix is not None and "decoder" in problem.prefix and cap.decoder else cap.stack
    layers = list(stack.attention_layers) if every else None
    if every and not layers:
        raise InputError("holds none of the model's own attention weights (captured with --max-attention-mb 0?)",
                         cap.source)
    verdicts = []
    for number in layers if layers is not None else [None]:
        built = from_capture(args, plain if number is None else replace(plain, layer=str(number)), reader, cap)
        c = captured(built)
        assert c is not None
        if c.own is None:
            raise InputError(f"holds no attention of the model for layer {c.layer} (it kept layers "
                             f"{', '.join(map(str, stack.attention_layers)) or 'none'}); capture with a larger "
                             "--max-attention-mb", cap.source)
        a = model_attention(built, run(built), c.own, c.valid, layer=c.layer, dtype=cap.dtype, family=c.family,
                            source=f"{cap.source} attentions[layer {c.layer}]")
        verdicts.append(a.verdict)
    if layers is None:
        return verdicts[0]
    return LayerVerdicts(verdicts, str(problem.weights), what="weights", numbers=layers)


def check_all_layers(args: list[str], problem: ProblemArgs, opts: Verify, reader: Any, given: dict[str, float]) -> Any:
    """``check OUTS HIDDEN --weights MODEL --layer all``: every layer's output against its checkpoint layer."""
    from attncli.check.layers import check_layers, per_layer
    from attncli.cli.inputs import _rope_scaling

    if problem.weights is None:
        raise InputError("all needs a checkpoint: --weights MODEL_FOLDER (or .safetensors, .bin, .pt)", "--layer")
    if opts.expected is not None:
        raise OptionRefused("is not offered with --layer all, which takes OUTS HIDDEN (each layer's attention output, "
                            "and the hidden states entering each layer)", INLINE)
    if len(args) != 2:
        raise InputError(f"--layer all takes OUTS HIDDEN (each layer's attention output, and the hidden states "
                         f"entering each layer), got {len(args)} argument{'s' if len(args) != 1 else ''}", "arguments")
    for flag, value in (("--what", opts.what not in (None, "output")), ("--valid-lens", problem.valid_lens),
                        ("--mask", problem.mask)):
        if value:
            raise InputError("is not offered with --layer all (each layer's output is compared)", flag)
    outs = per_layer(reader.read(args[0]), reader.source(args[0]), "attention outputs")
    hidden = per_layer(reader.read(args[1]), reader.source(args[1]), "hidden states")
    flags = dict(problem.options)
    if flags.get("rope_scaling") is not None:
        flags["rope_scaling"] = _rope_scaling(flags["rope_scaling"], reader)
    return check_layers(outs, hidden, str(problem.weights), flags=flags, prefix=problem.prefix, heads=problem.heads,
                        from_residual=problem.from_residual, batch_first=problem.batch_first, given=given,
                        precision=opts.precision_of, search=opts.search, pairs=opts.pairs,
                        sources=(reader.source(args[0]), reader.source(args[1])))


def expected_steps(spec: str | None, reader: Any) -> list[str]:
    """The steps a problem file's ``expected:`` mapping names (e.g. scores, weights, output); [] otherwise."""
    if spec is None:
        return []
    content = reader.read(spec)
    value = content.get("expected") if isinstance(content, dict) else None
    return [str(k) for k in value] if isinstance(value, dict) else []


def split_arguments(args: list[str], inline: str | None, reader: Any) -> tuple[str | None, list[str]]:
    """(where the expected numbers are, the input arguments). ``None``: inline ``--expected`` text."""
    if inline is not None:
        if not args:
            raise InputError("no inputs given: expected Q [K [V]] or a problem file after the options", "arguments")
        return (inline if _is_file_spec(inline) else None), args
    if len(args) == 1:
        content = reader.read(args[0])
        if isinstance(content, dict) and "expected" in content:
            return args[0], args
        raise InputError("is the only argument but has no 'expected' entry; give EXPECTED first "
                         "(attncli check EXPECTED Q [K [V]]) or use --expected", reader.source(args[0]))
    if len(args) > 4:
        raise InputError(f"expected EXPECTED and 1 to 3 inputs, got {len(args)} arguments", "arguments")
    return args[0], args[1:]


def _is_file_spec(text: str) -> bool:
    from attncli.io.files import LOADERS, STDIN

    return text == STDIN or (Path(text).suffix.lower() in LOADERS and not text.lstrip().startswith("["))


def read_expected(spec: str | None, inline: str | None, reader: Any,
                  what: str) -> tuple[np.ndarray, list[str] | None, str, str | None]:
    """(expected array, the numbers as written or None for binary, where they came from, 'float16' or
    'bfloat16' when the file held them in that type).

    ``spec`` None: the inline ``--expected`` text. In a mapping (problem file, .npz), the entry
    ``expected``, else the entry named like the compared step, else its only array."""
    from attncli.check.verdict import written_numbers
    from attncli.core.backend import half_type

    if spec is None:
        return (*_inline(inline or ""), None)
    source = reader.source(spec)
    content = reader.read(spec)
    path: tuple[str, ...] = ("expected",)
    if isinstance(content, dict):
        value, path = _entry(content, what, source)
        if path == ("expected",) and "expected" not in content:
            value = reader.array(spec, "expected")  # the file's only array
    else:
        value = content
    array = _as_numbers(value, source)
    data, ext = reader.raw.get(spec), reader.formats.get(spec, "")  # each input is read once (a FIFO, stdin)
    try:
        written = written_numbers(bytes(data).decode("utf-8-sig"), ext, path) if data is not None else None
    except Exception:  # the loader already read it: a text we cannot re-scan only costs the inferred precision
        written = None
    return array, written, source, half_type(value)


def _entry(content: dict[str, Any], what: str, source: str) -> tuple[Any, tuple[str, ...]]:
    """The expected numbers in a mapping, and their path: ``expected`` (itself a mapping by step
    name, as in the examples, or an array), else an entry named like the step (an .npz saved by
    ``attncli run --save``)."""
    if "expected" in content:
        value = content["expected"]
        if isinstance(value, dict):
            if what not in value:
                raise InputError(f"has expected numbers for {', '.join(map(str, value))} but not for {what!r}; "
                                 f"use --what {next(iter(value), 'output')}", source)
            return value[what], ("expected", what)
        return value, ("expected",)
    if what in content:
        return content[what], (what,)
    return None, ("expected",)


def _inline(text: str) -> tuple[np.ndarray, list[str] | None, str]:
    from attncli.check.verdict import written_numbers
    from attncli.io.files import load_yaml

    try:  # the YAML loader every file goes through: its limits, and 1e3 read as a number
        doc = load_yaml(text.encode(), INLINE)
    except InputError as e:
        raise InputError(f"is not a list of numbers ({str(e).removeprefix(INLINE + ': ')[:120]})", INLINE) from None
    return _as_numbers(doc, INLINE), written_numbers(text, "inline"), INLINE


def _as_numbers(value: Any, source: str) -> np.ndarray:
    """Expected numbers as float64; null / .nan are NaN (a row of NaN can be the expected result)."""

    def nulls(x: Any) -> Any:
        return [nulls(y) for y in x] if isinstance(x, list) else (np.nan if x is None else x)

    if isinstance(value, (str, dict)):
        raise InputError("holds no array of numbers (expected a list of rows or an array)", source)
    try:
        arr = np.asarray(nulls(value) if isinstance(value, list) else value)
    except ValueError:
        raise InputError("expected numbers are ragged: rows of different lengths", source) from None
    if arr.dtype.kind not in "iuf" or arr.dtype.kind == "b":
        raise InputError(f"expected numbers hold {'booleans' if arr.dtype.kind == 'b' else 'non-numbers'}", source)
    if arr.ndim == 0:
        arr = arr.reshape(1, 1)
    elif arr.ndim == 1:
        arr = arr[None, :]
    return arr.astype(np.float32 if arr.dtype == np.float32 else np.float64)
