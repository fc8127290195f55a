"""Options shared by several commands, declared once and attached with ``@with_options``.

Each group is a list of ``inspect.Parameter`` with a Typer ``Annotated`` type; the
decorator appends them to a command's signature and hands their values to the command
as one ``opts`` dict, so ``run``, ``check`` and ``examples run`` take the same options
without repeating them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from attncli.backend import BACKENDS, DEVICES, DTYPES
from attncli.diagnostics import SIMILARITIES
from attncli.options import CAUSAL_ALIGNS, MASK_CONVENTIONS, QK_NORMS, ROPE_MODES
from attncli.scoring import ACTIVATIONS, SCALINGS, score_names

Group = list[inspect.Parameter]


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
EXPLAIN = "Explanations and pictures"
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
    option("batch_first", bool, True, "--batch-first/--no-batch-first", rich_help_panel=MH,
           help="Inputs are (B, T, D) (default) or (T, B, D) as PyTorch's default layout; the steps are always "
                "batch-first."),
]
HEAD_OPTION: Group = [
    option("head", Optional[int], None, "--head", min=0, rich_help_panel=MH,
           help="Show only this head's steps in the terminal view (JSON, NPZ and --save keep every head)."),
]

FORMAT_CHOICES = ("rich", "json", "npz")
FormatChoice = choices("FormatChoice", FORMAT_CHOICES)

OUTPUT_OPTIONS: Group = [
    option("format", FormatChoice, FormatChoice("rich"), "--format", "-f", rich_help_panel=OUTPUT,
           help="rich: the step-by-step view; json: one JSON object on stdout; npz: an NPZ archive on stdout."),
    option("save", Optional[Path], None, "--save", "-o", rich_help_panel=OUTPUT,
           help="Also write every step to FILE (.npz or .json), atomically; FILE.npy holds the output alone "
                "(then the weights are never held: large inputs run in blocks)."),
    option("precision", int, 4, "--precision", "-p", min=0, max=17, rich_help_panel=OUTPUT,
           help="Decimals shown in the terminal view (JSON and NPZ keep full precision)."),
    option("steps", Optional[str], None, "--steps", rich_help_panel=OUTPUT,
           help="Comma-separated steps to show/save, e.g. weights,output (default: all)."),
    option("full", bool, False, "--full", rich_help_panel=OUTPUT,
           help="Show every row, column and batch entry of big matrices."),
    option("quiet", bool, False, "--quiet", "-q", rich_help_panel=OUTPUT,
           help="No terminal view and no warnings on stderr (use with --save)."),
    option("explain", Optional[list[str]], None, "--explain", "-e", rich_help_panel=EXPLAIN,
           help="Explain one score and weight cell: QUERY,KEY by labels (it,milk) or indices (2,1); "
                "batched inputs take a batch prefix, e.g. 0:2,1 (or 0,1:2,1). Repeatable."),
    option("explain_row", Optional[list[str]], None, "--explain-row", rich_help_panel=EXPLAIN,
           help="Explain one query row: its whole softmax and its output as a weighted sum of value rows "
                "(a label, an index, or BATCH:QUERY). Repeatable."),
    option("similarity", Optional[SimilarityChoice], None, "--similarity", rich_help_panel=EXPLAIN,
           help="Compare the output rows with each other (dot or cosine) and name each one's nearest."),
    option("svg", Optional[Path], None, "--svg", rich_help_panel=EXPLAIN,
           help="Also save the terminal view, exactly as shown, as an SVG picture."),
    option("html", Optional[Path], None, "--html", rich_help_panel=EXPLAIN,
           help="Also save the terminal view, exactly as shown, as an HTML page."),
    option("plot", Optional[Path], None, "--plot", rich_help_panel=EXPLAIN,
           help="Draw the weights as heatmap(s) (one per head/batch entry) to FILE.png, .svg or .pdf "
                "(needs matplotlib: pip install 'attncli[plot]')."),
]


def with_options(*groups: Group) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Append option groups to a command; their values reach it as ``opts: dict``."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "opts"]
        extra = [p for g in groups for p in g]
        names = [p.name for p in extra]

        @functools.wraps(fn)
        def wrapper(**kwargs: Any) -> Any:
            opts = {n: kwargs.pop(n) for n in names if n in kwargs}
            if opts.get("threads"):  # --threads, for every command that takes it
                from attncli.backend import set_threads

                set_threads(opts["threads"])
            return fn(**kwargs, opts=opts)

        del wrapper.__wrapped__  # Typer must see the new signature, not fn's
        wrapper.__signature__ = sig.replace(parameters=own + extra)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in own + extra}
        return wrapper

    return deco
