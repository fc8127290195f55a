"""The command line's options, each declared once, and the flags built from the declarations.

An option is a field of a small frozen dataclass declared with :func:`attncli.core.options.option`:
its name, type, default, help, panel and the commands that offer it. The computation's options are
the fields of :class:`attncli.core.options.Options` (their checks are there too); the command line's
own are the groups below (:class:`ProblemArgs`, :class:`View`, and ``check``'s ``Verify``). A command
names the groups it takes as typed parameters; :func:`takes_options` turns each group's fields that
the command offers into Typer options and hands the parsed values back as that group's instance, so
a command sees only its own flags, typed, never looked up by name.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Optional

import typer
from typer.core import TyperCommand

from attncli.core.diagnostics import SIMILARITIES
from attncli.core.options import (
    COMPUTE,
    COMPUTING,
    EXPLAIN,
    LABELS,
    MASKING,
    MULTIHEAD,
    OUTPUT,
    PANELS,
    PARAMS,
    PICTURES,
    PROJECTING,
    TODAY,
    Opt,
    Options,
    declared,
    hints,
    option,
)
from attncli.render import FORMAT_MODULES

VIEWING = frozenset({"run", "self", "examples run"})  # the commands that show or save a trace
CAPTURING = frozenset({"self", "check", "view"})  # the commands that take a capture or --text
ONE_HEAD = frozenset({"self", "examples run"})


@dataclass(frozen=True)
class ProblemArgs:
    """What builds the problem besides the input arrays (attncli.cli.inputs.build_problem): the computation's
    options given as flags, files named by flags, labels, and the projections' flags (``self``, ``check``,
    ``examples run``; ``run`` keeps their defaults, for a problem file with x and weights)."""

    COMMANDS: ClassVar[frozenset[str]] = COMPUTING

    valid_lens: str | None = option(
        None, "Valid key counts as in d2l: '2,3' (one per batch entry), '2,3;1,2' (per query), or a file.", MASKING,
        essential=True)
    mask: str | None = option(
        None, "Mask file: boolean/0-1 (meaning set by --mask-convention) or float (added to the scores).", MASKING,
        essential=True)
    labels: str | None = option(
        None, "Comma-separated labels for both queries and keys (self-attention).", LABELS)
    query_labels: str | None = option(
        None, "Comma-separated query (row) labels, e.g. cat,milk,it,sweet.", LABELS)
    key_labels: str | None = option(None, "Comma-separated key (column) labels.", LABELS)
    weights: Path | None = option(
        None, "Weights (.npz .yaml .json, or a PyTorch state dict .pt) in the textbook convention q @ W_q. "
              "Multi-head: the projections W_q, W_k, W_v (W_o, biases) or an nn.MultiheadAttention state dict. "
              "Otherwise the score's: W (d_q,d_k) for general; W_q (d_q,h), W_k (d_k,h), w_v (h,), b (h,) for "
              "additive; W (d_k,), b for location; w for gaussian. nn.Linear names (W_q.weight of shape (h,d_q), "
              "...) are converted.", PARAMS, short="-w")
    # the fields of Options given as flags (None: not given), by name, as a file's options: mapping; their
    # flags are listed here, among these (attncli.core.options.Options.merged checks them)
    options: Mapping[str, Any] = field(default_factory=dict, metadata={"options": Options})
    threads: int | None = option(
        None, "CPU threads for numpy's BLAS and torch (default: as OMP_NUM_THREADS / OPENBLAS_NUM_THREADS, "
              "else every core).", COMPUTE, min=1)
    alibi_slopes: str | None = option(
        None, "ALiBi with these slopes (a file, one per head); implies --alibi.", TODAY)
    sinks: str | None = option(
        None, "Attention sinks (a file, one logit per head, gpt-oss): an extra softmax column, dropped, so rows "
              "sum to less than 1. With self, also read from --weights (sinks).", TODAY)
    # projections and heads: `self`, `check` and `examples run`
    heads: int | None = option(
        None, "Multi-head attention with H heads (dividing d_k and d_v): inputs X [MEMORY [VALUES]], --weights "
              "the projections W_q, W_k, W_v (W_o, biases).", MULTIHEAD,
        commands=PROJECTING, min=1, essential=True)
    memory: str | None = option(
        None, "Cross-attention: keys and values are projected from this (B, S, D_k) instead of X.", MULTIHEAD,
        commands=PROJECTING)
    values: str | None = option(
        None, "Project the values from this (B, S, D_v) instead of the memory (PyTorch's separate key and value "
              "inputs).", MULTIHEAD, commands=PROJECTING)
    key_padding_mask: str | None = option(
        None, "(B, S) file: True/1 = ignore that key (PyTorch key_padding_mask).", MULTIHEAD, commands=PROJECTING)
    d_k: int | None = option(
        None, "Without --weights: width of Q and K (default d_model).", MULTIHEAD, commands=PROJECTING, min=1)
    d_v: int | None = option(
        None, "Without --weights: width of V (default d_k).", MULTIHEAD, commands=PROJECTING, min=1)
    init: str = option(
        "mha", "Without --weights: mha (nn.MultiheadAttention: xavier, zero biases) or linear (nn.Linear: uniform "
               "±1/sqrt(fan_in), as d2l).", MULTIHEAD, commands=PROJECTING, choices=lambda: ("mha", "linear"))
    bias: bool = option(
        True, "Without --weights: include b_q, b_k, b_v, b_o.", MULTIHEAD, commands=PROJECTING)
    out_proj: bool = option(
        True, "Without --weights: apply an output projection W_o.", MULTIHEAD, commands=PROJECTING)
    prefix: str | None = option(
        None, "Module prefix of the attention weights in a bigger state dict, e.g. encoder.attn.", MULTIHEAD,
        commands=PROJECTING)
    layout: str | None = option(
        None, "With a checkpoint whose config.json model_type attncli does not declare: read it as this declared "
              "family (e.g. llama), at your own risk.", MULTIHEAD, commands=PROJECTING)
    layer: str | None = option(
        None, "With a checkpoint (--weights MODEL_FOLDER, .safetensors, sharded index, .bin/.pt state dict): "
              "the layer whose attention to compute (its config.json supplies heads, RoPE, window, ...); "
              "check: 'all' checks every layer at once (OUTS HIDDEN, one array per layer).",
        MULTIHEAD, commands=PROJECTING)
    from_residual: bool = option(
        False, "X is the residual stream entering the layer (hidden_states[N]): apply the layer's own "
               "pre-attention norm from the checkpoint first.", MULTIHEAD, commands=PROJECTING)
    batch_first: bool = option(
        True, "Inputs are (B, T, D) (default) or (T, B, D) as PyTorch's default layout; the steps are always "
              "batch-first.", MULTIHEAD, commands=PROJECTING)
    # a capture (attncli capture) or text captured in memory (attncli.cli.inputs.from_capture)
    text: str | None = option(
        None, "With --weights MODEL: capture this text with the model's own tokenizer and forward (transformers) "
              "first, and compute on the residual stream it gives (tokens as labels).", MULTIHEAD, commands=CAPTURING)
    text_file: str | None = option(
        None, "As --text, one text per line (a padded batch).", MULTIHEAD, commands=CAPTURING)
    model_dtype: str = option(
        "float32", "--text: the model's forward in this dtype (float32, bfloat16, float16, auto).", MULTIHEAD,
        commands=CAPTURING, choices=lambda: ("float32", "bfloat16", "float16", "auto"))
    model_device: str | None = option(
        None, "--text: the model's forward on this device (cpu, cuda, mps).", MULTIHEAD, commands=CAPTURING)
    cross: bool = option(
        False, "With a capture taken with --target: the decoder layer's cross-attention over the encoder's output.",
        MULTIHEAD, commands=CAPTURING)
    keep_going: bool = option(
        False, "Show the numbers even when they differ from the model's own attention in the capture (under a "
               "warning) or the model changed since the capture.", MULTIHEAD, commands=CAPTURING)


@dataclass(frozen=True)
class View:
    """How to show and save the trace: ``run``, ``self`` and ``examples run``."""

    COMMANDS: ClassVar[frozenset[str]] = VIEWING

    head: int | None = option(
        None, "Show only this head's steps in the terminal view (JSON, NPZ and --save keep every head).", MULTIHEAD,
        commands=ONE_HEAD, min=0)
    format: str = option(
        "rich", "On stdout: rich, the step-by-step view; json or npz, every step; latex or markdown, the worked "
                "solution as a document.", OUTPUT, short="-f", essential=True,
        choices=lambda: list(FORMAT_MODULES))  # the renderers' registry: a new renderer needs no edit here
    save: Path | None = option(
        None, "Also write every step to FILE (.npz, .json, .tex or .md); FILE.npy holds the output alone (then "
              "large inputs run in blocks).", OUTPUT, short="-o",
        essential=True)
    precision: int = option(
        4, "Decimals shown in the terminal view (JSON and NPZ keep full precision).", OUTPUT, short="-p",
        min=0, max=17)
    steps: str | None = option(
        None, "Comma-separated steps to show/save, e.g. weights,output (default: all).", OUTPUT, essential=True)
    full: bool = option(False, "Show every row, column and batch entry of big matrices.", OUTPUT)
    quiet: bool = option(False, "No terminal view and no warnings on stderr (use with --save).", OUTPUT, short="-q")
    explain: tuple[str, ...] = option(
        (), "Explain one score and weight cell: QUERY,KEY by labels (it,milk) or indices (2,1), "
            "BATCH:QUERY,KEY when batched (0:2,1). Repeatable.", EXPLAIN, short="-x",
        essential=True)
    explain_row: tuple[str, ...] = option(
        (), "Explain one query row: its whole softmax and its output as a weighted sum of value rows "
            "(a label, an index, or BATCH:QUERY). Repeatable.", EXPLAIN)
    similarity: str | None = option(
        None, "Compare the output rows with each other (dot or cosine) and name each one's nearest.", EXPLAIN,
        choices=lambda: list(SIMILARITIES))
    plot: Path | None = option(
        None, "Draw heatmaps (one per head and batch entry) to FILE.png, .svg or .pdf "
              "(needs matplotlib: pip install 'attncli\\[plot]').", PICTURES, essential=True)
    plot_steps: str | None = option(
        None, "Steps --plot draws, e.g. scores,weights (default weights).", PICTURES)
    vmin: float | None = option(
        None, "Fix the low end of --plot's colour scale (default: the smallest value drawn).", PICTURES)
    vmax: float | None = option(
        None, "Fix the high end of --plot's colour scale (default: the largest value drawn).", PICTURES)
    dpi: int | None = option(
        None, "Resolution of --plot's PNG in dots per inch (default 100).", PICTURES, min=20, max=1200)
    figsize: str | None = option(
        None, "Size of --plot's figure in inches, WIDTH,HEIGHT (default: 3 per panel).", PICTURES)
    html: Path | None = option(
        None, "Write an interactive page (one file): every step as a heatmap, a cell's arithmetic on click.",
        PICTURES, essential=True)
    svg: Path | None = option(
        None, "Save the terminal view as an SVG picture, --width columns wide.", PICTURES)
    theme: str | None = option(
        None, "Colours of --svg: dark (a terminal, default) or light (for slides).", PICTURES,
        choices=lambda: ("dark", "light"))
    width: int | None = option(
        None, "Columns of --svg's view (default 100), whatever the terminal's width.", PICTURES, min=40, max=400)

    def needs_weights(self) -> bool:
        """Whether something asked for reads the attention weights (pictures, explanations, similarities)."""
        return bool(self.svg or self.html or self.plot or self.explain or self.explain_row or self.similarity)


# ---- from declarations to Typer options, and back ------------------------------------------


def choices(name: str, values: list[str] | tuple[str, ...]) -> type[Enum]:
    """A str Enum for Typer built from a registry's keys."""
    return _choices(name, tuple(values))


@functools.cache
def _choices(name: str, values: tuple[str, ...]) -> type[Enum]:  # once per option, whichever commands offer it
    return Enum(name, {v: v for v in values}, type=str)  # type: ignore[return-value]


HIDDEN: dict[str, set[str]] = {}  # option name -> choices accepted but not listed in --help (aliases)
OFFERED: dict[str, list[Opt]] = {}  # command -> the options it offers, in --help's order (panel, declaration)


@dataclass(frozen=True)
class Flag:
    """One option as a command offers it: its declaration, its group, and whether it is a field of Options
    (given only when not None: a file's or the default value applies otherwise)."""

    spec: Opt
    group: str = dataclasses.field(compare=False)  # the command's parameter that receives it
    hint: Any  # the field's type
    given_only: bool


def offered(cls: type, command: str) -> list[tuple[Opt, Any, bool]]:
    """(declaration, type, is an Options field) of every option of group ``cls`` that ``command`` offers, in
    declaration order (the options a group holds for Options listed where that field is)."""
    types = hints(cls)
    specs = declared(cls)
    out: list[tuple[Opt, Any, bool]] = []
    for f in fields(cls):
        inner = f.metadata.get("options")
        if inner is not None:
            out += [(s, h, True) for s, h, _ in offered(inner, command)]
        elif f.name in specs and command in group_commands(cls, specs[f.name]):
            out.append((specs[f.name], types[f.name], False))
    return out


def group_commands(cls: type, spec: Opt) -> frozenset[str]:
    """The commands offering ``spec``: its own list, else its group's (``COMMANDS``)."""
    if spec.commands is not None:
        return spec.commands
    commands: frozenset[str] = cls.COMMANDS  # type: ignore[attr-defined]  # every group declares it
    return commands


def _plain(hint: Any) -> Any:
    """``T`` of ``T | None``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if type(None) in typing.get_args(hint) and len(args) == 1 else hint


@functools.cache  # one per option, shared by the commands that offer it
def parameter(flag: Flag) -> inspect.Parameter:
    """The Typer option of one declaration."""
    spec = flag.spec
    t = spec.flag_type or _plain(flag.hint)
    default = None if flag.given_only else spec.default
    names = [spec.long]
    if spec.choices is not None:
        shown = list(spec.choices())
        hidden = [c for c in (spec.hidden() if spec.hidden else ()) if c not in shown]
        if hidden:
            HIDDEN[spec.name] = set(hidden)
        t = choices(spec.name.title().replace("_", "") + "Choice", [*shown, *hidden])
        default = None if default is None else t(default)
    elif t is bool:
        if flag.given_only or spec.default is True or spec.off:
            names = [f"{spec.long}/{spec.off or '--no-' + spec.long[2:]}"]
    elif typing.get_origin(t) is tuple:
        t, default = list[str], None  # repeatable
    if spec.short:
        names.append(spec.short)
    info = typer.Option(*names, help=spec.help, rich_help_panel=spec.panel, min=spec.min, max=spec.max)
    return inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[Optional[t] if default is None else t, info])


def takes_options(command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give ``command`` the flags of the option groups its parameters are typed with (ProblemArgs, View, ...),
    those the command offers; their values reach it as one typed instance per group."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)
        groups = {p.name: p.annotation for p in sig.parameters.values()
                  if isinstance(p.annotation, type) and is_dataclass(p.annotation) and hasattr(p.annotation, "COMMANDS")}
        own = [p for p in sig.parameters.values() if p.name not in groups]
        flags = [Flag(spec, group, hint, given_only) for group, cls in groups.items()
                 for spec, hint, given_only in offered(cls, command)]
        names = [f.spec.name for f in flags]
        assert len(set(names)) == len(names), f"{command}: an option declared twice"
        flags.sort(key=lambda f: PANELS.index(f.spec.panel))  # stable: declaration order within a panel
        params = [parameter(f) for f in flags]
        OFFERED[command] = [f.spec for f in flags]

        @functools.wraps(fn)
        def wrapper(**kwargs: Any) -> Any:
            values: dict[str, dict[str, Any]] = {g: {} for g in groups}
            given: dict[str, dict[str, Any]] = {g: {} for g in groups}
            for f in flags:
                v = kwargs.pop(f.spec.name)
                v = v.value if isinstance(v, Enum) else tuple(v) if isinstance(v, list) else v
                if isinstance(v, float) and math.isnan(v) and f.spec.check is None:
                    from attncli.errors import InputError  # NaN passes every min=/max=; Options' checks say it

                    raise InputError("must be a finite number, got nan", f.spec.long)
                if not f.given_only:
                    values[f.group][f.spec.name] = v
                elif v is not None:
                    given[f.group][f.spec.name] = v
            built = {}
            for g, cls in groups.items():
                inner = [f.name for f in fields(cls) if "options" in f.metadata]
                built[g] = cls(**values[g], **{n: given[g] for n in inner})
                threads = getattr(built[g], "threads", None)
                if threads:  # --threads, for every command that takes it
                    from attncli.core.backend import set_threads

                    set_threads(threads)
            return fn(**kwargs, **built)

        del wrapper.__wrapped__  # Typer must see the new signature, not fn's
        wrapper.__signature__ = sig.replace(parameters=own + params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in own + params}
        return wrapper

    return deco


class HelpCommand(TyperCommand):
    """``--help`` laid out to fit any width: option names on their own line when long, the
    description below them and wrapped at spaces only (never inside a word or an option name),
    choices listed in the description (aliases left out), and nothing read as markup (so
    ``pip install 'attncli[plot]'`` prints as written). Paragraphs of a command's help are
    re-flowed to the width; indented lines (examples) keep their indentation.

    Plain ``--help`` shows the command's essential options (declared ``essential=True``) in one
    section and a line pointing to ``--help-all``, which shows every option, one section per help
    panel in PANELS' order (the common tasks first)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        help_option = self.get_help_option(ctx)
        if help_option is None:
            return params  # type: ignore[no-any-return]
        if getattr(self, "_help_all_option", None) is None:
            # the help option's own class (click's, or typer's vendored copy): --help-all is another such flag
            self._help_all_option = type(help_option)(
                param_decls=[HELP_ALL], is_flag=True, expose_value=False, is_eager=True, callback=_show_all,
                help="Show every option, grouped by task, and exit.")
        return [*params, self._help_all_option]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        width = max(40, min(formatter.width or 80, 100))
        self.format_usage(ctx, formatter)
        lines: list[str] = []
        everything = bool(ctx.meta.get(HELP_ALL))
        essential = essentials(ctx)
        paras = (self.help or "").strip().split("\n\n")
        if not everything and essential is not None:  # the first two paragraphs and the examples
            examples = next((i for i, p in enumerate(paras) if p.strip() == "Examples:"), len(paras))
            paras = paras[:min(2, examples)] + [p for p in paras[2:examples] if p.startswith("Exit codes")] \
                + paras[examples:]
        for para in paras:
            if para.startswith("  "):  # an example: its own lines, continued 6 spaces in
                for line in para.splitlines():
                    lines += wrap(line.strip(), width, "    ", "      ")
            else:
                lines += wrap(" ".join(para.split()), width, "  ", "  ")
            lines.append("")
        left_out: dict[str, int] = {}  # panel -> options --help leaves out
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if getattr(param, "param_type_name", "") == "argument":
                name = "Arguments"
            elif everything or essential is None:
                name = getattr(param, "rich_help_panel", None) or "Options"
            elif param.name in essential or getattr(param, "rich_help_panel", None) is None:
                name = "Options"  # the essentials, and the options no panel holds (--help, --help-all)
            else:
                panel = getattr(param, "rich_help_panel", None) or "Options"
                left_out[panel] = left_out.get(panel, 0) + 1
                continue
            sections.setdefault(name, []).append(help_record(param, record))
        for name, rows in sections.items():
            lines.append(f"{name}:")
            for first, text in rows:
                if len(first) <= NAMES_WIDTH - 4:
                    body = wrap(text, width, " " * NAMES_WIDTH, " " * NAMES_WIDTH) or [""]
                    lines.append(f"  {first.ljust(NAMES_WIDTH - 2)}{body[0][NAMES_WIDTH:]}".rstrip())
                    lines += body[1:]
                else:
                    lines += wrap(first, width, "  ", "      ")
                    lines += wrap(text, width, " " * NAMES_WIDTH, " " * NAMES_WIDTH)
            lines.append("")
        if left_out:
            lines += wrap(f"{sum(left_out.values())} more options, by task, and the details: {ctx.command_path} "
                          f"{HELP_ALL}", width, "", "  ")
        formatter.write("\n" + "\n".join(lines).rstrip() + "\n")


HELP_ALL = "--help-all"


def _show_all(ctx: Any, param: Any, value: bool) -> None:
    """``--help-all``: the help with every option, then exit (as --help does)."""
    if value and not ctx.resilient_parsing:
        ctx.meta[HELP_ALL] = True
        typer.echo(ctx.get_help(), color=ctx.color)
        ctx.exit()


def command_key(ctx: Any) -> str:
    """The command's name as OFFERED knows it ('run', 'examples run'): the names below the program's."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return " ".join(reversed(names))


def essentials(ctx: Any) -> set[str] | None:
    """The names of the essential options of the command ``ctx`` runs (None: it declares none, so --help
    shows all)."""
    specs = OFFERED.get(command_key(ctx))
    if specs is None:
        return None
    return {s.name for s in specs if s.essential}


NAMES_WIDTH = 30  # columns of option names before their descriptions


def wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    """Lines of at most ``width`` columns, broken at spaces only (a word longer than a line stays whole)."""
    import textwrap

    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False,
                         break_long_words=False)


def help_record(param: Any, record: tuple[str, str]) -> tuple[str, str]:
    """An option's (names, description) with its choices listed in the description (aliases left out)."""
    first, text = record
    text = text.replace("\\[", "[")  # rich's escape in a help text, for plain output
    choices = list(getattr(param.type, "choices", None) or [])
    if choices:
        shown = [str(getattr(c, "value", c)) for c in choices]
        shown = [c for c in shown if c not in HIDDEN.get(param.name or "", ())] or shown
        cut = min((first.index(ch) for ch in "<[" if ch in first), default=len(first))
        first = first[:cut].rstrip() + " " + (param.name or "value").upper().replace("_", "-")
        text = f"{text} One of: {', '.join(shown)}." if text else f"One of: {', '.join(shown)}."
    return first, text


def use_help_layout(app: typer.Typer) -> None:
    """Give every command of ``app`` (and of its sub-apps) the HelpCommand layout."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = HelpCommand
    for group in app.registered_groups:
        if group.typer_instance is not None:
            use_help_layout(group.typer_instance)
