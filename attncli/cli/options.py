"""Options shared by several commands, declared once and attached with ``@with_options``.

Each group is a list of ``inspect.Parameter`` with a Typer ``Annotated`` type; the
decorator appends them to a command's signature and hands their values to the command
as one typed :class:`Args`, so ``run``, ``self``, ``check`` and ``examples run`` take the
same options without repeating them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperCommand

from attncli.core.backend import BACKENDS, DEVICES, DTYPES
from attncli.core.diagnostics import SIMILARITIES
from attncli.core.options import CAUSAL_ALIGNS, MASK_CONVENTIONS, QK_NORMS, ROPE_MODES
from attncli.core.scoring import ACTIVATIONS, ALIASES, SCALINGS, score_names

Group = list[inspect.Parameter]
HIDDEN_CHOICES = set(ALIASES)  # accepted, but not listed in --help


def choices(name: str, values: list[str] | tuple[str, ...]) -> type[Enum]:
    """A str Enum for Typer built from a registry's keys."""
    return Enum(name, {v: v for v in values}, type=str)  # type: ignore[return-value]


ScoreChoice = choices("ScoreChoice", score_names())
ScalingChoice = choices("ScalingChoice", list(SCALINGS))
ActivationChoice = choices("ActivationChoice", list(ACTIVATIONS))
MaskConvention = choices("MaskConvention", MASK_CONVENTIONS)
CausalAlign = choices("CausalAlign", CAUSAL_ALIGNS)
Dtype = choices("Dtype", DTYPES)
BackendChoice = choices("BackendChoice", BACKENDS)
DeviceChoice = choices("DeviceChoice", DEVICES)
SimilarityChoice = choices("SimilarityChoice", list(SIMILARITIES))
RopeChoice = choices("RopeChoice", ROPE_MODES)
QkNormChoice = choices("QkNormChoice", QK_NORMS)


def option(name: str, annotation: Any, default: Any, *flags: str, help: str, **kw: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[annotation, typer.Option(*flags, help=help, **kw)])


COMPUTE = "Computation"
MASKING = "Masks and valid lengths"
LABELS = "Labels"
PARAMS = "Score parameters"
OUTPUT = "Output"
EXPLAIN = "Explanations"
PICTURES = "Pictures"
TODAY = "Today's models"

PROBLEM_OPTIONS: Group = [
    option("score", Optional[ScoreChoice], None, "--score", "-s", rich_help_panel=COMPUTE,
           help="Scoring function (default scaled-dot)."),
    option("scale", Optional[float], None, "--scale", rich_help_panel=COMPUTE,
           help="Multiply the scores by this instead of the score's own scaling (e.g. 1/sqrt(d))."),
    option("scaling", Optional[ScalingChoice], None, "--scaling", rich_help_panel=COMPUTE,
           help="Scaling rule: sqrt-d (scaled-dot's default), none, seq (sqrt(d)·sqrt(n)), norm (‖S‖_F)."),
    option("temperature", Optional[float], None, "--temperature", "-t", rich_help_panel=COMPUTE,
           help="Divide the (scaled) scores by T before the softmax."),
    option("valid_lens", Optional[str], None, "--valid-lens", rich_help_panel=MASKING,
           help="Valid key counts as in d2l: '2,3' (one per batch entry), '2,3;1,2' (per query), or a file."),
    option("mask", Optional[str], None, "--mask", rich_help_panel=MASKING,
           help="Mask file: boolean/0-1 (meaning set by --mask-convention) or float (added to the scores)."),
    option("mask_convention", Optional[MaskConvention], None, "--mask-convention", rich_help_panel=MASKING,
           help="keep (default, as PyTorch SDPA): 1/True takes part. drop (as key_padding_mask and the notes' "
                "score += mask·-1e9): 1/True is masked out."),
    option("mask_value", Optional[float], None, "--mask-value", rich_help_panel=MASKING,
           help="Value given to masked scores (default -inf: masked weights are exactly 0; -1e6 reproduces d2l)."),
    option("causal", Optional[bool], None, "--causal/--no-causal", rich_help_panel=MASKING,
           help="Mask keys after each query (as PyTorch is_causal)."),
    option("causal_align", Optional[CausalAlign], None, "--causal-align", rich_help_panel=MASKING,
           help="When queries and keys differ in number: top-left (is_causal, default) or bottom-right "
                "(causal_lower_right)."),
    option("labels", Optional[str], None, "--labels", rich_help_panel=LABELS,
           help="Comma-separated labels for both queries and keys (self-attention)."),
    option("query_labels", Optional[str], None, "--query-labels", rich_help_panel=LABELS,
           help="Comma-separated query (row) labels, e.g. cat,milk,it,sweet."),
    option("key_labels", Optional[str], None, "--key-labels", rich_help_panel=LABELS,
           help="Comma-separated key (column) labels."),
    option("dtype", Optional[Dtype], None, "--dtype", rich_help_panel=COMPUTE,
           help="Compute in float32 or float64 (default: float32 only if every input is float32)."),
    option("backend", Optional[BackendChoice], None, "--backend", rich_help_panel=COMPUTE,
           help="numpy (default, CPU) or torch (needs PyTorch)."),
    option("device", Optional[DeviceChoice], None, "--device", rich_help_panel=COMPUTE,
           help="cpu (default), cuda or mps (imply torch), or auto (CUDA, then MPS, then the CPU)."),
    option("threads", Optional[int], None, "--threads", min=1, rich_help_panel=COMPUTE,
           help="CPU threads for numpy's BLAS and torch (default: as OMP_NUM_THREADS / OPENBLAS_NUM_THREADS, "
                "else every core)."),
    option("weights", Optional[Path], None, "--weights", "-w", rich_help_panel=PARAMS,
           help="Weights (.npz .yaml .json, or a PyTorch state dict .pt) in the textbook convention q @ W_q. "
                "Multi-head: the projections W_q, W_k, W_v (W_o, biases) or an nn.MultiheadAttention state dict. "
                "Otherwise the score's: W (d_q,d_k) for general; W_q (d_q,h), W_k (d_k,h), w_v (h,), b (h,) for "
                "additive; W (d_k,), b for location; w for gaussian. nn.Linear names (W_q.weight of shape (h,d_q), "
                "...) are converted."),
    option("hidden", Optional[int], None, "--hidden", min=1, rich_help_panel=PARAMS,
           help="Hidden width h of weights initialised without --weights (default: the query width)."),
    option("seed", Optional[int], None, "--seed", rich_help_panel=PARAMS,
           help="Seed of numpy.random.default_rng for initialised weights (nn.Linear style, uniform "
                "±1/sqrt(fan_in)) and dropout (default 0); numpy and torch get the same numbers."),
    option("activation", Optional[ActivationChoice], None, "--activation", rich_help_panel=PARAMS,
           help="Activation of the additive and location scores (default tanh)."),
    option("bandwidth", Optional[float], None, "--bandwidth", rich_help_panel=PARAMS,
           help="σ of the gaussian score -‖q-k‖²/(2σ²) (default 1)."),
    option("hard", Optional[bool], None, "--hard/--soft", rich_help_panel=COMPUTE,
           help="Hard attention: one-hot weights at each row's largest weight (ties: the first key)."),
    option("dropout", Optional[float], None, "--dropout", min=0.0, max=1.0, rich_help_panel=COMPUTE,
           help="Inverted dropout on the weights as nn.Dropout(P) in training (default 0), seeded by --seed."),
    option("rope", Optional[RopeChoice], None, "--rope", rich_help_panel=TODAY,
           help="Rotary position embedding of q and k: half (HF Llama rotate_half) or interleaved (GPT-J, Meta's "
                "pairs). Query i at position P + i (--q-offset), key j at j."),
    option("rope_base", Optional[float], None, "--rope-base", rich_help_panel=TODAY,
           help="RoPE theta: frequencies base^(-2k/d) (default 10000; config rope_theta)."),
    option("rotary_dim", Optional[int], None, "--rotary-dim", rich_help_panel=TODAY,
           help="Rotate only the first N features of each head (even; GPT-J rotary_dim, GPT-NeoX rotary_pct·d)."),
    option("rope_scaling", Optional[str], None, "--rope-scaling", rich_help_panel=TODAY,
           help="config.json's rope_scaling as JSON or a .json/.yaml file: {\"rope_type\": \"linear\"|\"llama3\"|"
                "\"yarn\"|\"dynamic\", \"factor\": 8, ...}."),
    option("q_offset", Optional[int], None, "--q-offset", rich_help_panel=TODAY,
           help="Query i sits at position P + i (default 0; n - m with --causal-align bottom-right): a KV-cache step "
                "of m new queries over n keys."),
    option("alibi", Optional[bool], None, "--alibi/--no-alibi", rich_help_panel=TODAY,
           help="ALiBi: add slope_h·(j - i) to the scores, slopes of the paper for the head count (heads: axis -3 "
                "of Q for run, --heads for self)."),
    option("alibi_slopes", Optional[str], None, "--alibi-slopes", rich_help_panel=TODAY,
           help="ALiBi with these slopes (a file, one per head); implies --alibi."),
    option("window", Optional[int], None, "--window", rich_help_panel=TODAY,
           help="Sliding window: causal, each query sees the W keys up to itself (HF sliding_window, FlashAttention "
                "window_size=(W-1, 0))."),
    option("softcap", Optional[float], None, "--softcap", rich_help_panel=TODAY,
           help="Logit soft-capping: scores become C·tanh(s/C) after scaling, before the mask (Gemma 2)."),
    option("sinks", Optional[str], None, "--sinks", rich_help_panel=TODAY,
           help="Attention sinks (a file, one logit per head, gpt-oss): an extra softmax column, dropped, so rows "
                "sum to less than 1. With self, also read from --weights (sinks)."),
    option("qk_norm", Optional[QkNormChoice], None, "--qk-norm", rich_help_panel=TODAY,
           help="RMSNorm of each head's q and k before RoPE: rms (Qwen3, w·x/rms) or rms1p (Gemma 3, (1+w)·x/rms); "
                "q_norm/k_norm weights from --weights (default none: w = 1)."),
    option("norm_eps", Optional[float], None, "--norm-eps", rich_help_panel=TODAY,
           help="eps of the QK-norm (default 1e-6; config rms_norm_eps)."),
]

MH = "Multi-head"
InitChoice = choices("InitChoice", ("mha", "linear"))

# Projections and heads: `self`, `check` and `examples run` build the same problem (cli/inputs.py).
MULTIHEAD_OPTIONS: Group = [
    option("heads", Optional[int], None, "--heads", min=1, rich_help_panel=MH,
           help="Multi-head attention with H heads (as `attncli self`; must divide d_k and d_v). Inputs are then "
                "X [MEMORY [VALUES]] and --weights holds the projections W_q, W_k, W_v (W_o, biases)."),
    option("memory", Optional[str], None, "--memory", rich_help_panel=MH,
           help="Cross-attention: keys and values are projected from this (B, S, D_k) instead of X."),
    option("values", Optional[str], None, "--values", rich_help_panel=MH,
           help="Project the values from this (B, S, D_v) instead of the memory (PyTorch's separate key and value "
                "inputs)."),
    option("key_padding_mask", Optional[str], None, "--key-padding-mask", rich_help_panel=MH,
           help="(B, S) file: True/1 = ignore that key (PyTorch key_padding_mask)."),
    option("kv_heads", Optional[int], None, "--kv-heads", min=1, rich_help_panel=MH,
           help="Grouped-query / multi-query attention: G K/V heads (a divisor of --heads); query head h reads K/V head "
                "h // (H/G). Default: as many as W_k's width holds."),
    option("d_k", Optional[int], None, "--d-k", min=1, rich_help_panel=MH,
           help="Without --weights: width of Q and K (default d_model)."),
    option("d_v", Optional[int], None, "--d-v", min=1, rich_help_panel=MH,
           help="Without --weights: width of V (default d_k)."),
    option("init", InitChoice, InitChoice("mha"), "--init", rich_help_panel=MH,
           help="Without --weights: mha (nn.MultiheadAttention: xavier, zero biases) or linear (nn.Linear: uniform "
                "±1/sqrt(fan_in), as d2l)."),
    option("bias", bool, True, "--bias/--no-bias", rich_help_panel=MH,
           help="Without --weights: include b_q, b_k, b_v, b_o."),
    option("out_proj", bool, True, "--out-proj/--no-out-proj", rich_help_panel=MH,
           help="Without --weights: apply an output projection W_o."),
    option("prefix", Optional[str], None, "--prefix", rich_help_panel=MH,
           help="Module prefix of the attention weights in a bigger state dict, e.g. encoder.attn."),
    option("layout", Optional[str], None, "--layout", rich_help_panel=MH,
           help="With a checkpoint whose config.json model_type attncli does not declare: read it as this declared "
                "family (e.g. llama), at your own risk."),
    option("layer", Optional[int], None, "--layer", min=0, rich_help_panel=MH,
           help="With a checkpoint (--weights MODEL_FOLDER, .safetensors, sharded index, .bin/.pt state dict): "
                "the layer whose attention to compute (its config.json supplies heads, RoPE, window, ...)."),
    option("from_residual", bool, False, "--from-residual", rich_help_panel=MH,
           help="X is the residual stream entering the layer (hidden_states[N]): apply the layer's own "
                "pre-attention norm from the checkpoint first."),
    option("batch_first", bool, True, "--batch-first/--no-batch-first", rich_help_panel=MH,
           help="Inputs are (B, T, D) (default) or (T, B, D) as PyTorch's default layout; the steps are always "
                "batch-first."),
]
HEAD_OPTION: Group = [
    option("head", Optional[int], None, "--head", min=0, rich_help_panel=MH,
           help="Show only this head's steps in the terminal view (JSON, NPZ and --save keep every head)."),
]

FORMAT_CHOICES = ("rich", "json", "npz", "latex", "markdown")
ThemeChoice = choices("ThemeChoice", ("dark", "light"))
FormatChoice = choices("FormatChoice", FORMAT_CHOICES)

OUTPUT_OPTIONS: Group = [
    option("format", FormatChoice, FormatChoice("rich"), "--format", "-f", rich_help_panel=OUTPUT,
           help="rich: the step-by-step view; json: one JSON object; npz: an NPZ archive; latex, markdown: "
                "the worked solution as a document (all on stdout)."),
    option("save", Optional[Path], None, "--save", "-o", rich_help_panel=OUTPUT,
           help="Also write every step to FILE (.npz, .json, .tex or .md), atomically; FILE.npy holds the "
                "output alone (then the weights are never held: large inputs run in blocks)."),
    option("precision", int, 4, "--precision", "-p", min=0, max=17, rich_help_panel=OUTPUT,
           help="Decimals shown in the terminal view (JSON and NPZ keep full precision)."),
    option("steps", Optional[str], None, "--steps", rich_help_panel=OUTPUT,
           help="Comma-separated steps to show/save, e.g. weights,output (default: all)."),
    option("full", bool, False, "--full", rich_help_panel=OUTPUT,
           help="Show every row, column and batch entry of big matrices."),
    option("quiet", bool, False, "--quiet", "-q", rich_help_panel=OUTPUT,
           help="No terminal view and no warnings on stderr (use with --save)."),
    option("explain", Optional[list[str]], None, "--explain", "-x", rich_help_panel=EXPLAIN,
           help="Explain one score and weight cell: QUERY,KEY by labels (it,milk) or indices (2,1); "
                "batched inputs take a batch prefix, e.g. 0:2,1 (or 0,1:2,1). Repeatable."),
    option("explain_row", Optional[list[str]], None, "--explain-row", rich_help_panel=EXPLAIN,
           help="Explain one query row: its whole softmax and its output as a weighted sum of value rows "
                "(a label, an index, or BATCH:QUERY). Repeatable."),
    option("similarity", Optional[SimilarityChoice], None, "--similarity", rich_help_panel=EXPLAIN,
           help="Compare the output rows with each other (dot or cosine) and name each one's nearest."),
    option("plot", Optional[Path], None, "--plot", rich_help_panel=PICTURES,
           help="Draw heatmaps (one per head and batch entry) to FILE.png, .svg or .pdf "
                "(needs matplotlib: pip install 'attncli\\[plot]')."),
    option("plot_steps", Optional[str], None, "--plot-steps", rich_help_panel=PICTURES,
           help="Steps --plot draws, e.g. scores,weights (default weights)."),
    option("vmin", Optional[float], None, "--vmin", rich_help_panel=PICTURES,
           help="Fix the low end of --plot's colour scale (default: the smallest value drawn)."),
    option("vmax", Optional[float], None, "--vmax", rich_help_panel=PICTURES,
           help="Fix the high end of --plot's colour scale (default: the largest value drawn)."),
    option("dpi", Optional[int], None, "--dpi", min=20, max=1200, rich_help_panel=PICTURES,
           help="Resolution of --plot's PNG in dots per inch (default 100)."),
    option("figsize", Optional[str], None, "--figsize", rich_help_panel=PICTURES,
           help="Size of --plot's figure in inches, WIDTH,HEIGHT (default: 3 per panel)."),
    option("html", Optional[Path], None, "--html", rich_help_panel=PICTURES,
           help="Write an interactive page (one self-contained file): every step as a heatmap, "
                "the arithmetic of a cell on click."),
    option("svg", Optional[Path], None, "--svg", rich_help_panel=PICTURES,
           help="Save the terminal view as an SVG picture, --width columns wide."),
    option("theme", Optional[ThemeChoice], None, "--theme", rich_help_panel=PICTURES,
           help="Colours of --svg: dark (a terminal, default) or light (for slides)."),
    option("width", Optional[int], None, "--width", min=40, max=400, rich_help_panel=PICTURES,
           help="Columns of --svg's view (default 100), whatever the terminal's width."),
]


@dataclass
class Args:
    """Every option of the commands, typed, built once at the CLI edge by :func:`with_options` from
    the flags (a str Enum becomes its value); an option a command lacks keeps its default here.
    The computation's own options go on to :class:`attncli.core.options.Options` (cli/inputs.py)."""

    # the problem (PROBLEM_OPTIONS): None = not given, the file's or the default applies
    score: str | None = None
    scale: float | None = None
    scaling: str | None = None
    temperature: float | None = None
    valid_lens: str | None = None
    mask: str | None = None
    mask_convention: str | None = None
    mask_value: float | None = None
    causal: bool | None = None
    causal_align: str | None = None
    labels: str | None = None
    query_labels: str | None = None
    key_labels: str | None = None
    dtype: str | None = None
    backend: str | None = None
    device: str | None = None
    threads: int | None = None
    weights: Path | None = None
    hidden: int | None = None
    seed: int | None = None
    activation: str | None = None
    bandwidth: float | None = None
    hard: bool | None = None
    dropout: float | None = None
    rope: str | None = None
    rope_base: float | None = None
    rotary_dim: int | None = None
    rope_scaling: Any = None  # JSON text, then the mapping it holds (cli/inputs.py)
    q_offset: int | None = None
    alibi: bool | None = None
    alibi_slopes: str | None = None
    window: int | None = None
    softcap: float | None = None
    sinks: str | None = None
    qk_norm: str | None = None
    norm_eps: float | None = None
    # projections and heads (MULTIHEAD_OPTIONS, HEAD_OPTION)
    heads: int | None = None
    memory: str | None = None
    values: str | None = None
    key_padding_mask: str | None = None
    kv_heads: int | None = None
    d_k: int | None = None
    d_v: int | None = None
    init: str = "mha"
    bias: bool = True
    out_proj: bool = True
    prefix: str | None = None
    layout: str | None = None
    layer: int | None = None
    from_residual: bool = False
    batch_first: bool = True
    head: int | None = None
    # output (OUTPUT_OPTIONS)
    format: str = "rich"
    save: Path | None = None
    precision: int = 4
    steps: str | None = None
    full: bool = False
    quiet: bool = False
    explain: list[str] = field(default_factory=list)
    explain_row: list[str] = field(default_factory=list)
    similarity: str | None = None
    plot: Path | None = None
    plot_steps: str | None = None
    vmin: float | None = None
    vmax: float | None = None
    dpi: int | None = None
    figsize: str | None = None
    html: Path | None = None
    svg: Path | None = None
    theme: str | None = None
    width: int | None = None
    # check (cli/check.py CHECK_OPTIONS)
    expected: str | None = None
    what: str = "output"
    atol: float | None = None
    rtol: float | None = None
    precision_of: str | None = None
    pairs: bool = True
    search: bool = True  # --explain/--no-explain of check: try the catalogue of mistakes

    @classmethod
    def of(cls, values: dict[str, Any]) -> Args:
        """From the parsed flags: Enums to their values, repeatable options to lists."""
        plain = {k: (v.value if isinstance(v, Enum) else v) for k, v in values.items()}
        for k in ("explain", "explain_row"):
            if k in plain and not isinstance(plain[k], bool):
                plain[k] = list(plain[k] or [])
        return cls(**plain)

    def given(self, name: str) -> Any:
        """The value of option ``name`` (None where the command has no such option)."""
        return getattr(self, name, None)


def with_options(*groups: Group) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Append option groups to a command; their values reach it as one typed ``opts: Args``."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "opts"]
        extra = [p for g in groups for p in g]
        names = [p.name for p in extra]
        validated = {p.name for p in PROBLEM_OPTIONS}  # checked by attncli.core.problem / attncli.core.validate

        @functools.wraps(fn)
        def wrapper(**kwargs: Any) -> Any:
            given = {n: kwargs.pop(n) for n in names if n in kwargs}
            nan = next((n for n, v in given.items() if isinstance(v, float) and v != v and n not in validated), None)
            if nan is not None:  # NaN passes every min=/max= check; problem options say it in their own words
                from attncli.errors import InputError

                raise InputError("must be a finite number, got nan", "--" + nan.replace("_", "-"))
            opts = Args.of(given)
            if opts.threads:  # --threads, for every command that takes it
                from attncli.core.backend import set_threads

                set_threads(opts.threads)
            return fn(**kwargs, opts=opts)

        del wrapper.__wrapped__  # Typer must see the new signature, not fn's
        wrapper.__signature__ = sig.replace(parameters=own + extra)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in own + extra}
        return wrapper

    return deco


class HelpCommand(TyperCommand):
    """``--help`` laid out to fit any width: option names on their own line when long, the
    description below them and wrapped at spaces only (never inside a word or an option name),
    choices listed in the description (aliases left out), one section per help panel, and nothing
    read as markup (so ``pip install 'attncli[plot]'`` prints as written). Paragraphs of a
    command's help are re-flowed to the width; indented lines (examples) keep their indentation."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        width = max(40, min(formatter.width or 80, 100))
        self.format_usage(ctx, formatter)
        lines: list[str] = []
        for para in (self.help or "").strip().split("\n\n"):
            if para.startswith("  "):  # an example: its own lines, continued 6 spaces in
                for line in para.splitlines():
                    lines += wrap(line.strip(), width, "    ", "      ")
            else:
                lines += wrap(" ".join(para.split()), width, "  ", "  ")
            lines.append("")
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            name = getattr(param, "rich_help_panel", None) or (
                "Arguments" if getattr(param, "param_type_name", "") == "argument" else "Options")
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
        formatter.write("\n" + "\n".join(lines).rstrip() + "\n")


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
        shown = [c for c in shown if c not in HIDDEN_CHOICES] or shown
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
