"""From command-line arguments and files to a validated Problem: one function for every command.

``run``, ``self``, ``check`` and ``examples run`` all call :func:`build_problem`, so each takes
every option the others do: a single-head problem (Q [K [V]], or a problem file with q, k, v)
or, with projections (``attncli self``, ``check --heads``, a file with x and weights), the inputs
X [MEMORY [VALUES]] of self-, cross- and multi-head attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attncli.cli.options import ProblemArgs
from attncli.core.layer import Layer
from attncli.core.options import Options, declared
from attncli.core.problem import Problem, numeric_array
from attncli.core.projections import Projections, init_projections
from attncli.core.validate import width as check_width
from attncli.core.weights import weights_mapping
from attncli.errors import InputError, printable
from attncli.io.files import LOADERS, SMALL_ARRAY_BYTES, STDIN, Reader

if TYPE_CHECKING:
    from attncli.io.model import CheckpointLayer

PROBLEM_KEYS = {"q", "k", "v", "valid_lens", "mask", "labels", "query_labels", "key_labels", "options",
                "weights", "expected", "description", "source", "sinks", "alibi_slopes"}
MULTIHEAD_KEYS = {"x", "memory", "values", "weights", "heads", "labels", "query_labels", "key_labels", "valid_lens",
                  "key_padding_mask", "mask", "options", "description", "source", "expected", "sinks", "alibi_slopes"}


def split_labels(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [t.strip() for t in text.split(",")]


def parse_valid_lens(text: str, reader: Reader) -> tuple[Any, str]:
    """``--valid-lens``: '2,3' (1-D), '2,3;1,2' (2-D) or a file; returns (array, source)."""
    if text == STDIN or Path(text).suffix.lower() in LOADERS:
        return reader.array(text, "valid_lens"), reader.source(text)
    try:
        rows = [[float(x) for x in row.split(",") if x.strip()] for row in text.split(";")]
    except ValueError:
        raise InputError(f"{text!r} is neither numbers like 2,3 (or 2,3;1,2) nor a file name", "--valid-lens") from None
    if len({len(r) for r in rows}) != 1:
        raise InputError(f"{text!r} has rows of different lengths", "--valid-lens")
    return np.asarray(rows[0] if len(rows) == 1 else rows), "--valid-lens"


def _labels(value: Any, source: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return split_labels(value)
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise InputError(f"labels must be a flat list, got shape {arr.shape}", source)
    return [str(x) for x in arr.tolist()]


def _rows(a: Any) -> int | None:
    """The number of rows of a (possibly still unvalidated) matrix, or None if it has none."""
    try:
        shape = np.shape(a)
    except ValueError:  # ragged: Problem validation reports it
        return None
    return shape[-2] if len(shape) >= 2 else 1


def _file_options(raw: Any, source: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InputError("'options' must be a mapping of option names to values", source)
    return {str(k).replace("-", "_"): v for k, v in raw.items()}


def _is_capture(content: Any) -> bool:
    """attncli.io.capture.is_capture, imported only for a file with a ``format`` entry (a plain run's start-up
    never loads the capture module)."""
    if not isinstance(content, dict) or "format" not in content:
        return False
    from attncli.io.capture import is_capture

    return is_capture(content)


def is_multihead(content: Any, opts: ProblemArgs) -> bool:
    """Projections and heads are part of the problem: ``--heads`` or ``--layer`` given, ``--weights`` a model
    checkpoint, or a file with x (and no q)."""
    weights = opts.weights
    return (opts.heads is not None or opts.layer is not None
            or (weights is not None and _checkpoint_path(str(weights)))
            or (isinstance(content, dict) and "x" in content and "q" not in content))


def stdin_once(inputs: list[str], opts: ProblemArgs) -> None:
    """Refuse a second ``-``: standard input can be read once (the argument or flag that names it again is
    said)."""
    given = [(f"argument {k + 1}", x) for k, x in enumerate(inputs)]
    given += [(f"--{name.replace('_', '-')}", getattr(opts, name)) for name in STDIN_FLAGS]
    named = [where for where, x in given if isinstance(x, str) and x == "-"]
    if len(named) > 1:
        raise InputError(f"'-' (standard input) is given again, after {named[0]}; stdin can be read once: "
                         "give this input as a file", named[1])


STDIN_FLAGS = ("valid_lens", "mask", "memory", "values", "key_padding_mask", "alibi_slopes", "sinks")


def did_you_mean(name: str, choices: Any) -> str:
    """'did you mean 'score'?' for a near miss among ``choices`` (difflib), else ''."""
    import difflib

    close = difflib.get_close_matches(name, sorted(map(str, choices)), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""


def build_problem(inputs: list[str], opts: ProblemArgs, reader: Reader, multihead: bool | None = None) -> Problem | Layer:
    """The Problem described by 1–3 input files (or ``-``) and the options (a flag wins over the file).

    Single-head: one input is a problem file (q, k, v, ...) or one matrix used as Q, K and V; two
    are Q and K (also V); three are Q, K, V. With projections (``multihead``, ``--heads`` or a file
    with x): X [MEMORY [VALUES]], or a file with x, weights, heads, ...
    """
    if wants_text(opts):  # --text: the capture is made here, in memory, and is the input
        if inputs:
            raise InputError(f"--text is the input; leave out {inputs[0]!r}", "arguments")
        return from_capture([], opts, reader, text_capture(opts))
    if not 1 <= len(inputs) <= 3:
        what = "X [MEMORY [VALUES]]" if multihead else "Q [K [V]]"
        raise InputError(f"expected 1 to 3 inputs ({what}), got {len(inputs)}", "arguments")
    stdin_once(inputs, opts)
    content = reader.read(inputs[0])
    if multihead is not False and _is_capture(content):
        return from_capture(inputs, opts, reader)
    file_source = reader.source(inputs[0])
    heads_mode = is_multihead(content, opts) if multihead is None else multihead
    names = ("q", "k", "v")
    key = "x" if heads_mode else "q"
    doc: dict[str, Any] = content if isinstance(content, dict) and key in content else {}
    if doc and reader.formats.get(inputs[0]) != ".npz":  # the format read (stdin: sniffed), not the name
        allowed = MULTIHEAD_KEYS if heads_mode else PROBLEM_KEYS
        unknown = set(map(str, doc)) - allowed
        if unknown:
            kind = "a multi-head file" if heads_mode else "a problem file"
            hint = did_you_mean(sorted(unknown)[0], allowed)
            if hint:
                raise InputError(f"unknown entry {sorted(unknown)[0]!r}; {hint}", file_source)
            shown = ", ".join(sorted(unknown)[:8])
            raise InputError(f"has unknown entries {shown}; {kind} holds {', '.join(sorted(allowed))}", file_source)
    sources: dict[str, str] = {}
    arrays: dict[str, Any] = {}
    if heads_mode:  # X [MEMORY [VALUES]], or --memory / --values, or the file's entries
        arrays["q"], sources["q"] = reader.array(inputs[0], "x"), file_source
        for slot, name, spec in (("k", "memory", inputs[1] if len(inputs) > 1 else opts.memory),
                                 ("v", "values", inputs[2] if len(inputs) > 2 else opts.values)):
            if spec is not None:
                arrays[slot], sources[slot] = reader.array(spec, name), reader.source(spec)
            elif doc.get(name) is not None:
                arrays[slot], sources[slot] = doc[name], file_source
    else:
        fallbacks = {"q": (), "k": ("q",), "v": ("k", "q")}  # in a problem file K defaults to Q, V to K
        for slot, spec in zip(names, inputs):
            arrays[slot] = reader.array(spec, slot, fallbacks[slot])
            sources[slot] = reader.source(spec)
        if doc and len(inputs) == 1:
            for slot in ("k", "v"):
                if slot in doc:
                    arrays[slot], sources[slot] = doc[slot], file_source

    def entry(name: str, spec: str | None) -> Any:
        if spec is not None:
            sources[name] = reader.source(spec)
            return reader.array(spec, name, cap=SMALL_ARRAY_BYTES if name in ("sinks", "alibi_slopes") else None)
        sources[name] = file_source
        return doc.get(name)

    mask = entry("mask", opts.mask)
    padding = entry("key_padding_mask", opts.key_padding_mask)
    sinks = entry("sinks", opts.sinks)
    slopes = entry("alibi_slopes", opts.alibi_slopes)
    flags = dict(opts.options)  # the Options fields given as flags
    if flags.get("rope_scaling") is not None:
        flags["rope_scaling"] = _rope_scaling(flags["rope_scaling"], reader)
    valid_lens = doc.get("valid_lens")
    sources["valid_lens"] = file_source
    if opts.valid_lens is not None:
        valid_lens, sources["valid_lens"] = parse_valid_lens(opts.valid_lens, reader)

    # `labels` name the queries, and the keys too when there are as many (self-attention)
    both = _labels(doc.get("labels"), file_source)
    if opts.labels:
        both = split_labels(opts.labels)
        sources["query_labels"] = sources["key_labels"] = "--labels"
    qlab = _labels(doc.get("query_labels"), file_source) or both
    if heads_mode:
        klab = _labels(doc.get("key_labels"), file_source) or (both if "k" not in arrays else None)
    else:
        klab = _labels(doc.get("key_labels"), file_source) or (
            both if both and len(both) == _rows(arrays.get("k", arrays["q"])) else None)
    if opts.query_labels:
        qlab, sources["query_labels"] = split_labels(opts.query_labels), "--query-labels"
    if opts.key_labels:
        klab, sources["key_labels"] = split_labels(opts.key_labels), "--key-labels"
    sources.setdefault("query_labels", file_source)
    sources.setdefault("key_labels", file_source)

    file_options = _file_options(doc.get("options"), file_source)
    options = Options().merged(file_options, file_source)
    _option_origins(sources, file_options, lambda n: f"{file_source}: option {n}")
    _option_origins(sources, flags, _flag)
    common: dict[str, Any] = dict(valid_lens=valid_lens, mask=mask, query_labels=qlab, key_labels=klab,
                                  sources=sources, padding=padding, sinks=sinks, alibi_slopes=slopes)
    if not heads_mode:
        for flag, value in (("--layer", opts.layer is not None), ("--from-residual", opts.from_residual),
                            ("--layout", opts.layout)):
            if value:
                raise InputError("applies to projections read from a checkpoint (attncli self, or --heads)", flag)
        weights, sources["weights"] = _score_weights(doc.get("weights"), file_source, opts.weights, reader)
        options = options.merged(flags, "command line", flags=True)
        return Problem.build(arrays["q"], arrays.get("k"), arrays.get("v"), score_weights=weights, options=options, **common)
    given_heads = opts.heads if opts.heads is not None else doc.get("heads")
    heads_source = "--heads" if opts.heads is not None else file_source
    if given_heads is not None and (isinstance(given_heads, bool) or not isinstance(given_heads, int)
                                    or not 1 <= given_heads <= MAX_HEADS):
        raise InputError(f"'heads' must be a whole number from 1 to {MAX_HEADS:,}, got {printable(repr(given_heads), 40)}",
                         heads_source)  # 0 was taken for 1
    layer = _projections(arrays, doc, file_source, opts, reader, options.merged(flags, "command line", flags=True),
                         given_heads or 1)
    if opts.from_residual and layer.model is None:
        raise InputError("needs a checkpoint read with --weights MODEL --layer N (its pre-attention norm)",
                         "--from-residual")  # a post-norm layer (BERT) takes the residual as it is
    sources["weights"] = layer.projections.source
    if layer.model is not None:  # config.json's facts over the file's options, under the flags
        config = layer.model.config_source
        _option_origins(sources, layer.model.options, layer.model.option_origin)
        _option_origins(sources, flags, _flag)  # a flag wins over config.json
        sources["pre_norm"] = config
        options = layer.model.config_options(options).merged(flags, "command line", flags=True)
        return layer.model.problem(arrays["q"], arrays.get("k"), arrays.get("v"), options=options, heads=given_heads,
                                   from_residual=bool(opts.from_residual), batch_first=opts.batch_first, **common)
    options = options.merged(flags, "command line", flags=True)
    heads = given_heads or 1
    try:
        return Layer.build(arrays["q"], arrays.get("k"), arrays.get("v"), projections=layer.projections, heads=heads,
                           batch_first=opts.batch_first, options=options, **common)
    except InputError as e:  # drawn projections whose widths --d-k / --d-v chose: those flags are the culprit
        widths = [f for f, v in (("--d-k", opts.d_k), ("--d-v", opts.d_v)) if v is not None]
        if e.source != SEEDED or not widths:
            raise
        flag = "--d-v" if "W_v" in str(e) and "--d-v" in widths else widths[0]
        raise InputError(str(e).removeprefix(f"{SEEDED}: ") + f" ({flag} sets that width)", flag) from None


SEEDED = "--seed"  # the source of projections drawn at random (core.projections.init_projections)
MAX_HEADS = 1 << 20


def _flag(name: str) -> str:
    return declared(Options)[name].long


def _option_origins(sources: dict[str, str], values: dict[str, Any], where: Callable[[str], str]) -> None:
    """Record where each option given in ``values`` came from (``sources["option NAME"]``), over what an earlier
    (lower) layer said: messages about an option name its file and key, never a flag the user did not give."""
    for name, value in values.items():
        if value is not None:
            sources[f"option {name}"] = where(name)


@dataclass
class Weights:
    """The projections of a problem: given, drawn from a seed, or one layer of a checkpoint (``model``)."""

    projections: Projections
    model: CheckpointLayer | None = None  # a checkpoint's layer (attncli.io.model): config facts, pre-norm, bias


def _rope_scaling(text: str, reader: Reader) -> Any:
    """--rope-scaling: JSON text, or a .json/.yaml file holding the mapping (or a config.json with rope_scaling or
    rope_parameters, whose rope_theta and partial_rotary_factor count as --rope-base and --rotary-dim)."""
    if text.lstrip().startswith("{"):
        return text  # checked (and parsed) with the other options
    if Path(text).suffix.lower() not in (".json", ".yaml", ".yml"):
        raise InputError(f"{text!r} is neither JSON like '{{\"rope_type\": \"linear\", \"factor\": 4}}' nor a .json/.yaml "
                         "file", "--rope-scaling")
    content = reader.read(text)
    for key in ("rope_parameters", "rope_scaling"):  # a whole config.json: transformers 5 names it rope_parameters
        if isinstance(content, dict) and isinstance(content.get(key), dict):
            return content[key]
    return content


def _projections(arrays: dict[str, Any], doc: dict[str, Any], src: str, opts: ProblemArgs, reader: Reader,
                 options: Options, heads: int = 1) -> Weights:
    """W_q, W_k, W_v (W_o, biases) from --weights (textbook arrays, a state dict, or one layer of a
    checkpoint), the file's weights: entry, or drawn from --seed."""
    given = [f for f, v in (("--d-k", opts.d_k), ("--d-v", opts.d_v)) if v is not None]
    for f, v in (("--d-k", opts.d_k), ("--d-v", opts.d_v)):
        if v is not None:
            check_width(v, f)  # before allocating a (d, heads·d_k) matrix: 10**12 is one line, not out of memory
    weights, prefix = opts.weights, opts.prefix
    if given and (weights is not None or "weights" in doc):
        raise InputError("applies only when the weights are initialised (no --weights); "
                         "the widths come from the weights", given[0])
    if opts.layer is not None and weights is None:
        raise InputError("needs a checkpoint: --weights MODEL_FOLDER (or .safetensors, .bin, .pt)", "--layer")
    if opts.layout is not None and weights is None:
        raise InputError("needs a checkpoint: --weights MODEL_FOLDER (or .safetensors, .bin, .pt)", "--layout")
    from attncli.io.layouts import projections_from  # the one registry of weight layouts (imported when used)

    if weights is not None:
        spec = str(weights)
        if opts.layer is not None or _checkpoint_path(spec):
            return checkpoint_layer(spec, layer_number(opts.layer), prefix, opts.heads, opts.layout)
        return Weights(projections_from(reader.read(spec), reader.source(spec), prefix))
    if "weights" in doc:
        return Weights(projections_from(doc, src, prefix))
    widths = [_width(arrays[s], t, src) if s in arrays else None for s, t in (("q", "X"), ("k", "memory"), ("v", "values"))]
    d_q = widths[0] or 1
    d_kv = widths[1] or d_q
    d_vv = widths[2] or d_kv
    return Weights(init_projections(d_q, d_kv, d_vv, d_k=opts.d_k, d_v=opts.d_v, seed=options.seed,
                                  init=opts.init, bias=opts.bias,
                                  out_proj=opts.out_proj, heads=heads, kv_heads=options.kv_heads))


def layer_number(text: str | None) -> int | None:
    """--layer N as a number (None: not given); 'all' is `attncli check`'s alone (every layer at once)."""
    if text is None:
        return None
    t = text.strip()
    if t.isdigit() and len(t) < 10:
        return int(t)
    if t.lower() == "all":
        raise InputError("'all' takes every layer at once, with `attncli check OUTS HIDDEN --weights MODEL --layer all` "
                         "or `attncli view HIDDEN --weights MODEL --layer all`; here give one layer number", "--layer")
    raise InputError(f"must be a layer number 0, 1, ... (or 'all' with check and view), got {printable(text, 40)!r}",
                     "--layer")


def _checkpoint_path(spec: str) -> bool:
    """A model folder, a .safetensors file or a sharded index: read as a checkpoint, layer by layer."""
    try:
        folder = Path(spec).is_dir()
    except (OSError, ValueError):  # a name too long, a NUL byte: the reader says so, naming it
        folder = False
    return folder or spec.lower().endswith((".safetensors", ".index.json"))


def checkpoint_layer(spec: str, layer: int | None, prefix: str | None, heads: int | None,
                     layout: str | None = None) -> Weights:
    """One layer of a checkpoint (attncli.io.model.load_layer): its projections, config facts, pre-norm, bias."""
    from attncli.io.model import load_layer

    model = load_layer(spec, layer, prefix, heads=heads, layout=layout)
    return Weights(model.projections, model)


def _width(a: Any, title: str, source: str) -> int | None:
    shape = numeric_array(a, title, source).shape  # a ragged list or a mapping: one line, not a numpy error
    return int(shape[-1]) if len(shape) in (2, 3) else None


def _score_weights(in_file: Any, file_source: str, path: Any, reader: Reader) -> tuple[dict[str, Any], str]:
    """Score weights from ``--weights FILE`` (which wins) or the problem file's ``weights:`` mapping."""
    if path is not None:
        spec = str(path)
        return weights_mapping(reader.read(spec), reader.source(spec)), reader.source(spec)
    if in_file is None:
        return {}, file_source
    return weights_mapping(in_file, file_source), file_source


# ---- captures (attncli capture) and --text ---------------------------------------------------------------

@dataclass
class Captured:
    """What a problem built from a capture brings besides its arrays: the model's own attention of the layer (to
    compare with), which queries and keys are real tokens, each entry's labels."""

    capture: Any  # attncli.io.capture.Capture
    layer: int
    own: Any  # (B, H, m, n) the model's own weights, or None when the capture did not keep them
    valid: tuple[Any, Any]  # (B, m), (B, n): real tokens
    query_labels: list[list[str]]
    key_labels: list[list[str]]
    keep_going: bool
    changed: str | None = None  # what changed in the model since the capture (provenance)

    @property
    def family(self) -> str:
        return str(self.capture.family)

    def json_labels(self) -> dict[str, Any]:
        """JSON ``labels`` as the tokenizer decoded them (spaces as they are, where the views show ␣): one list per
        entry when the entries' labels differ."""
        if all(q == self.query_labels[0] for q in self.query_labels) and \
                all(k == self.key_labels[0] for k in self.key_labels):
            return {"queries": self.query_labels[0], "keys": self.key_labels[0]}
        return {"queries": self.query_labels, "keys": self.key_labels}


CAPTURED: dict[int, Captured] = {}  # by id() of the problem built from a capture, within one command


def captured(problem: Any) -> Captured | None:
    """The capture a problem was built from (None: it was not)."""
    return CAPTURED.get(id(problem))


def text_capture(opts: ProblemArgs) -> Any:
    """--text / --text-file with --weights MODEL: the capture, run in memory (the model is freed after)."""
    from attncli.cli.capture import read_texts
    from attncli.io.hf import capture

    if opts.weights is None:
        flag = "--text" if opts.text is not None else "--text-file"
        raise InputError("needs the model to run: --weights MODEL_FOLDER", flag)
    texts = ([opts.text] if opts.text is not None else []) + (read_texts(opts.text_file) if opts.text_file else [])
    return capture(str(opts.weights), texts, dtype=opts.model_dtype, device=opts.model_device)


def wants_text(opts: ProblemArgs) -> bool:
    return opts.text is not None or opts.text_file is not None


def from_capture(inputs: list[str], opts: ProblemArgs, reader: Reader, cap: Any = None) -> Layer:
    """The layer ``--layer N`` of ``--weights MODEL`` on a capture's residual stream entering it (``--from-residual``
    implied): tokens as labels, padding as the key padding mask; remembered in CAPTURED with the model's own
    attention of that layer, to compare with once computed."""
    from attncli.io.capture import capture_from

    if cap is None:
        if len(inputs) != 1:
            raise InputError(f"a capture is the only input (X: the residual stream it holds); got {len(inputs)} inputs",
                             "arguments")
        cap = capture_from(reader.read(inputs[0]), reader.source(inputs[0]))
    source = cap.source
    if opts.weights is None:
        raise InputError("holds a model's residual stream; give that model: --weights MODEL_FOLDER --layer N", source)
    for flag, given in (("--memory", opts.memory), ("--values", opts.values), ("--key-padding-mask", opts.key_padding_mask),
                        ("--labels", opts.labels), ("--query-labels", opts.query_labels),
                        ("--key-labels", opts.key_labels), ("--valid-lens", opts.valid_lens)):
        if given is not None:
            raise InputError(f"comes from the capture {source} (its tokens, its padding); leave it out", flag)
    number = layer_number(opts.layer)
    if number is None:
        raise InputError("a capture holds every layer's input; choose one with --layer N (or --layer all with view "
                         "and check)", "--layer")
    if opts.cross:
        return _cross(cap, number, opts, reader)
    decoder = opts.prefix is not None and "decoder" in opts.prefix
    stack = cap.decoder if decoder else cap.stack
    if stack is None:
        raise InputError(f"--prefix {opts.prefix} names a decoder, but the capture holds none (capture with --target)",
                         source)
    spec = str(opts.weights)
    changed = _unchanged_since(cap, spec, bool(opts.keep_going))
    model = checkpoint_layer(spec, number, opts.prefix, opts.heads, opts.layout).model
    assert model is not None
    if number >= model.layers:
        raise InputError(f"has layers 0 to {model.layers - 1}", "--layer")
    x = stack.state(number, source)
    flags = dict(opts.options)
    if flags.get("rope_scaling") is not None:
        flags["rope_scaling"] = _rope_scaling(flags["rope_scaling"], reader)
    sources = {"q": f"{source} hidden_states[{number}]", "key_padding_mask": f"{source} attention_mask",
               "query_labels": f"{source} labels", "key_labels": f"{source} labels", "pre_norm": model.config_source}
    _option_origins(sources, model.options, model.option_origin)
    _option_origins(sources, flags, _flag)
    options = model.config_options(Options()).merged(flags, "command line", flags=True)
    labels = [list(row) for row in stack.labels]
    shown = _shown(labels)
    pad = stack.padding if stack.padded else None
    problem = model.problem(x, options=options, heads=opts.heads, from_residual=True, batch_first=True,
                            query_labels=shown, key_labels=shown, sources=sources, padding=pad,
                            mask=_padded_queries(stack.padding, options, sources, source))
    valid = ~stack.padding
    CAPTURED[id(problem)] = Captured(cap, number, stack.model_attention(number), (valid, valid), labels, labels,
                                     bool(opts.keep_going), changed)
    return problem


def _unchanged_since(cap: Any, spec: str, keep_going: bool) -> str | None:
    """What changed in the model ``spec`` since the capture was taken (config.json keys, weights' headers), or None;
    a change refuses the read unless ``keep_going``."""
    from attncli.io.capture import provenance_mismatch

    changed = provenance_mismatch(cap, spec)
    if changed and not keep_going:
        raise InputError(f"does not match the capture {cap.source} any more: {changed}; capture again, or --keep-going",
                         spec)
    return changed


def _shown(rows: list[list[str]]) -> list[str]:
    """The views' labels of a batch's token rows: a token's own spaces made visible (␣ cat), which a table, a page or
    a plot would lose; entries that differ share one label per position ("cat | dog"); JSON keeps each entry's."""
    from attncli.io.capture import visible

    if all(r == rows[0] for r in rows):
        return [visible(t) for t in rows[0]]
    return [" | ".join(dict.fromkeys(visible(t) for t in col)) for col in zip(*rows)]


def _cross(cap: Any, number: int, opts: ProblemArgs, reader: Reader) -> Layer:
    """``--cross``: decoder layer ``number``'s cross-attention, its queries from the input the capture kept of it,
    its keys and values from the encoder's last hidden state (attncli.io.cross reads the projections)."""
    from attncli.io.cross import load_cross_layer

    source, dec = cap.source, cap.decoder
    if dec is None or cap.cross_inputs is None:
        raise InputError("holds no decoder: --cross needs a capture of an encoder-decoder model taken with --target",
                         source)
    spec = str(opts.weights)
    changed = _unchanged_since(cap, spec, bool(opts.keep_going))
    model = load_cross_layer(spec, number, opts.prefix, heads=opts.heads)
    kept = list(dec.state_layers) if dec.state_layers is not None else list(range(dec.hidden_states.shape[0] - 1))
    if number not in kept:
        raise InputError(f"holds the cross-attention inputs of decoder layers {kept}, not layer {number}", source)
    x = np.asarray(cap.cross_inputs[kept.index(number)])
    memory = np.asarray(cap.hidden_states[-1])  # the encoder's output, which every cross-attention reads
    flags = dict(opts.options)
    sources = {"q": f"{source} cross_inputs[{number}]", "k": f"{source} hidden_states[-1] (the encoder's output)",
               "key_padding_mask": f"{source} attention_mask", "query_labels": f"{source} decoder_labels",
               "key_labels": f"{source} labels"}
    _option_origins(sources, flags, _flag)
    options = model.config_options(Options()).merged(flags, "command line", flags=True)
    qlab, klab = [list(r) for r in dec.labels], [list(r) for r in cap.labels]
    pad = cap.stack.padding if cap.stack.padded else None
    problem = model.problem(x, memory, options=options, heads=opts.heads, batch_first=True,
                            query_labels=_shown(qlab), key_labels=_shown(klab), sources=sources, padding=pad,
                            mask=_padded_queries(dec.padding, options, sources, source))
    own = None
    if cap.cross_attentions is not None and number in dec.attention_layers:
        own = np.asarray(cap.cross_attentions[dec.attention_layers.index(number)])
    CAPTURED[id(problem)] = Captured(cap, number, own, (~dec.padding, ~cap.stack.padding), qlab, klab,
                                     bool(opts.keep_going), changed)
    return problem


def _padded_queries(padding: Any, options: Options, sources: dict[str, str], source: str) -> Any:
    """A mask (B, 1, T, 1) that leaves padded queries out (their rows fully masked: zero weights, never shown as
    the model's), in the convention the options read masks in; None without padding."""
    pad = np.asarray(padding, dtype=bool)
    if not pad.any():
        return None
    sources["mask"] = f"{source} attention_mask (padded queries left out)"
    keep = ~pad[:, None, :, None]
    return keep if options.mask_convention == "keep" else ~keep


def agreement(problem: Any, trace: Any) -> Any:
    """The comparison of a problem built from a capture with the model's own attention of its layer (None: not
    built from a capture, or the capture has no attention for it); beyond the bound, a one-line refusal unless
    --keep-going. Sets the trace's JSON ``model_attention`` (and per-entry ``labels``)."""
    c = captured(problem)
    if c is None:
        return None
    trace.extra["labels"] = c.json_labels()
    _padded_rows_unsaid(trace, c.valid[0])
    if c.own is None or "weights" not in trace:
        return None
    from attncli.check.model import model_attention

    a = model_attention(problem, trace, c.own, c.valid, layer=c.layer, dtype=c.capture.dtype, family=c.family,
                        source=c.capture.source)
    trace.extra["model_attention"] = a.to_dict()
    if not a.agrees and not c.keep_going:
        why = f"; {c.changed}" if c.changed else ""
        raise InputError(f"layer {c.layer}: the recomputation differs from the model's own attention by "
                         f"{a.max_abs_diff:.1e} (bound {a.bound:.1e}, family {c.family}){why}; "
                         "--keep-going shows it anyway", c.capture.source)
    return a


def _padded_rows_unsaid(trace: Any, valid: Any) -> None:
    """Padded queries (left padding in a causal model) see no key: not worth a warning each when every row with
    every key masked is one (they are left out of the comparison, and their weights are zero)."""
    dead = trace.dead
    if dead is None:
        return
    d = np.asarray(dead, dtype=bool)
    pad = ~np.asarray(valid, dtype=bool)  # (B, m)
    while d.ndim > pad.ndim:  # (B, H, m) -> (B, m): dead in any head
        d = np.asarray(d.any(axis=1))
    if d.shape != pad.shape or not d.any() or (d & ~pad).any():
        return
    trace.warnings[:] = [w for w in trace.warnings if "masked" not in w]
