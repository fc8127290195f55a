"""``attncli heads``: what every head of a model does, measured over one input or many, named by stated thresholds;
``attncli heads merge A.json B.json ... --save all.json``: the statistics of the union of shards."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attncli.cli import app, handles_errors
from attncli.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from attncli.core.headstats import Inputs
else:
    from attncli.lazy import numpy as np

HEADS_HELP = """What every head does: statistics over every valid query of every input, and the patterns they pass.

Per layer × query head, from the weights that multiply V, computed block by block of queries (no T × T map is
held): entropy, entropy_norm, first, self, previous, next, max, distance, sink_share, special, punctuation,
induction, duplicate (definitions in --format json). Each head is named by the patterns it passes: sink
(first >= 0.3), previous-token (previous >= 0.5), self (self >= 0.5), induction (induction >= 0.4), broad
(entropy_norm >= 0.9), focused (max >= 0.9); --threshold PATTERN=VALUE changes one. A head that passes none is
unnamed.

Inputs, with --weights MODEL: HIDDEN (layers + 1, [B,] T, E), the residual stream entering every layer (--layer all,
the default); X (T, E) or (B, T, E) of one layer (--layer N; --from-residual when X is the residual stream); a
capture (.npz of attncli capture: hidden states, token ids, labels, padding, special tokens); --text or
--text-file (captured in memory with the model's own tokenizer, --batch-size texts at a time); or --induction N
(TransformerLens's probe: BOS + N random tokens repeated twice, the second copy scored).

Examples:

  attncli heads hidden.npy --weights ./tiny-llama

  attncli heads --induction 50 --weights ./tiny-llama --metric induction --top 5

  attncli heads --text-file corpus.txt --weights ./tiny-llama --format csv

  attncli heads shard1.npy --weights M --save a.json; attncli heads merge a.json b.json --save all.json
"""

FORMATS = ("table", "json", "csv")
CAPTURE_FORMAT = "attncli-capture/1"
PROBE_BATCH = 4


@app.command("heads", help=HEADS_HELP)
@handles_errors
def heads_command(
    inputs: Annotated[list[str] | None, typer.Argument(metavar="[HIDDEN | X | CAPTURE]... | merge STATS.json...",
                                                       show_default=False)] = None,
    weights: Annotated[str | None, typer.Option("--weights", "-w", help="The model: a folder with config.json and "
                                                "its weights (or .safetensors).", show_default=False)] = None,
    layer: Annotated[str | None, typer.Option(help="N (the inputs are X of layer N) or all (HIDDEN; the default).",
                                              show_default=False)] = None,
    from_residual: Annotated[bool, typer.Option("--from-residual", help="X is the residual stream: the layer's "
                                                "own norm first (implied by HIDDEN and captures).")] = False,
    induction: Annotated[int | None, typer.Option(help="Feed TransformerLens's induction probe: BOS + N seeded random "
                                                  "tokens repeated twice (batch 4), the second copy scored.",
                                                  min=2, show_default=False)] = None,
    seed: Annotated[int, typer.Option(help="Seed of the induction probe's tokens.")] = 0,
    text: Annotated[list[str] | None, typer.Option(help="Capture this text with the model's own tokenizer and "
                                                   "forward (transformers), then measure it (repeatable).",
                                                   show_default=False)] = None,
    text_file: Annotated[str | None, typer.Option(help="As --text, one text per line: a corpus, captured and "
                                                  "measured --batch-size texts at a time.", show_default=False)] = None,
    batch_size: Annotated[int, typer.Option(help="Texts captured at once (--text-file).", min=1)] = 8,
    exclude_first: Annotated[bool, typer.Option("--exclude-first", help="Drop the first position's key and "
                                                "renormalise (TransformerLens's exclude_bos).")] = False,
    exclude_self: Annotated[bool, typer.Option("--exclude-self", help="Drop each query's own key and renormalise "
                                               "(TransformerLens's exclude_current_token).")] = False,
    metric: Annotated[str | None, typer.Option(help="Show this statistic (layers × heads, coloured) instead of "
                                               "the patterns.", show_default=False)] = None,
    top: Annotated[int | None, typer.Option(help="The K heads highest on --metric.", min=1,
                                            show_default=False)] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, json (one object per head, the definitions and "
                                     "thresholds) or csv (one row per head).")] = "table",
    plot: Annotated[Path | None, typer.Option(help="One figure (.png .pdf .svg): a layers × heads panel per "
                                              "statistic.", show_default=False)] = None,
    save: Annotated[Path | None, typer.Option(help="Save the statistics with their sums, counts and sums of "
                                              "squares (.json), to merge later.", show_default=False)] = None,
    threshold: Annotated[list[str] | None, typer.Option(help="PATTERN=VALUE: a pattern's threshold (repeatable).",
                                                        show_default=False)] = None,
    rollout: Annotated[Path | None, typer.Option(help="Attention rollout (Abnar & Zuidema 2020) of every layer, T <= "
                                                 "2048, saved as .npy (inputs, layers, T, T).",
                                                 show_default=False)] = None,
    cross: Annotated[bool, typer.Option("--cross", help="The decoder's cross-attention layers, of captures made with "
                                        "--target (an encoder-decoder model; with --prefix naming its decoder's "
                                        "layers): entropy, max, first, special, punctuation; the positional "
                                        "statistics null.")] = False,
    prefix: Annotated[str | None, typer.Option(help="With --cross: the decoder layers' name prefix, as self's "
                                               "(model.decoder.layers. for BART, decoder.block. for T5).",
                                               show_default=False)] = None,
    dtype: Annotated[str, typer.Option(help="float32 or float64: what the weights are computed in.")] = "float32",
    backend: Annotated[str | None, typer.Option(help="numpy (default, CPU) or torch (needs PyTorch): what computes "
                                                "the projections and scores; the statistics are summed on the CPU, "
                                                "block by block.", show_default=False)] = None,
    device: Annotated[str, typer.Option(help="cpu (default), cuda or mps (imply torch), or auto (CUDA, then MPS, "
                                        "then the CPU): where the projections and scores are computed.")] = "cpu",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or notes on stderr.")] = False,
) -> None:
    from attncli.core import headstats as hs
    from attncli.core.backend import get_backend

    if fmt not in FORMATS:
        raise InputError(f"must be one of {', '.join(FORMATS)}, got {fmt!r}", "--format")
    if metric is not None and metric not in hs.STATS:
        raise InputError(f"no statistic {metric!r}; the statistics are {', '.join(hs.STATS)}", "--metric")
    if top is not None and metric is None:
        raise InputError("ranks heads on a statistic: give --metric NAME too", "--top")
    if dtype not in ("float32", "float64"):
        raise InputError(f"must be float32 or float64, got {dtype!r}", "--dtype")
    if plot is not None and plot.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise InputError("--plot writes .png, .pdf or .svg", str(plot))
    if rollout is not None and rollout.suffix.lower() != ".npy":
        raise InputError("rollout is saved as .npy (inputs, layers, T, T)", str(rollout))
    limits = hs.thresholds(_parse_thresholds(threshold or []))
    args = list(inputs or [])
    be = get_backend(backend, device)  # before any model is read: an unknown or absent device is refused first
    if rollout is not None and args and args[0] == "merge":
        raise InputError("rolls out the weights of inputs; merge has none", "--rollout")
    if args and args[0] == "merge":
        doc = _merge(args[1:], limits if threshold else None)
    elif cross:
        if text or text_file or induction is not None or rollout is not None or exclude_self:
            raise InputError("measures the cross-attention of captures made with --target: give captures only (no "
                             "--text, --text-file, --induction, --rollout or --exclude-self)", "--cross")
        doc = _measure_cross(args, weights, prefix, layer, exclude_first, limits, dtype, quiet, be)
    else:
        texts = list(text or [])
        if text_file is not None:
            from attncli.cli.capture import read_texts

            texts += read_texts(text_file)
        doc = _measure(args, weights, layer, from_residual, induction, seed, exclude_first, exclude_self, limits,
                       dtype, rollout, quiet, texts, batch_size, be)
    _emit(doc, fmt, metric, top, plot, save, protect=args)


def _parse_thresholds(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise InputError(f"expected PATTERN=VALUE like sink=0.3, got {item!r}", "--threshold") from None
        if not eq:
            raise InputError(f"expected PATTERN=VALUE like sink=0.3, got {item!r}", "--threshold")
    return out


# ---- measuring ---------------------------------------------------------------------------------------------------


def _measure(args: list[str], weights: str | None, layer: str | None, from_residual: bool, induction: int | None,
             seed: int, exclude_first: bool, exclude_self: bool, limits: dict[str, float], dtype: str,
             rollout: Path | None, quiet: bool, texts: list[str] | None = None, batch_size: int = 8,
             be: Any = None) -> dict[str, Any]:
    from attncli.cli.run import progress_bar
    from attncli.core import engine
    from attncli.core import headstats as hs
    from attncli.core.backend import get_backend
    from attncli.core.options import Options
    from attncli.io import headsfile
    from attncli.io.files import Reader
    from attncli.io.model import load_layer

    if weights is None:
        raise InputError("needs the model: --weights MODEL_FOLDER (its config.json and weights)", "--weights")
    texts = texts or []
    if not args and induction is None and not texts:
        raise InputError("give inputs (HIDDEN, X or a capture), --text, --text-file or --induction N", "arguments")
    if (args or texts) and induction is not None:
        raise InputError("feeds the model its own probe: give no inputs with it", "--induction")
    first = load_layer(weights, 0)
    count = first.layers
    single = None
    if layer is not None and layer.strip().lower() != "all":
        t = layer.strip()
        if not (t.isdigit() and int(t) < count):
            raise InputError(f"must be a layer number 0 to {count - 1} or all, got {t[:40]!r}", "--layer")
        single = int(t)
    layers = [single] if single is not None else list(range(count))
    if rollout is not None and single is not None:
        raise InputError("rolls out every layer from the first: use --layer all", "--rollout")
    sources: list[tuple[str, Any]] = [("--induction", None)] if induction is not None else []
    sources += [(spec, None) for spec in args]
    sources += [("--text", texts[i:i + batch_size]) for i in range(0, len(texts), batch_size)]  # captured in turn
    be = be or get_backend("numpy")
    heads = int(first.heads or 0)
    sums = hs.Sums.zeros(len(layers), heads)
    hashes: list[str] = []
    rolled: list[np.ndarray] = []
    model_layers = {L: first if L == 0 else load_layer(weights, L) for L in layers}  # the attention weights, once
    with progress_bar(quiet) as progress:
        for k, (spec, chunk) in enumerate(sources):  # one input file at a time: memory flat in the number of files
            if spec == "--induction":
                where, inp = spec, _probe(weights, first, induction or 0, seed)
            elif spec == "--text":
                from attncli.io.hf import capture

                where, inp = spec, _from_capture(capture(weights, chunk, max_attention_mb=0))
            else:
                reader = Reader()  # a fresh reader: no file's contents outlive its turn
                where, inp = reader.source(spec), _read_input(reader, spec, single, count)
            residual = from_residual or inp.residual
            for b in range(inp.batch):
                hashes.append(headsfile.input_hash(
                    inp.hidden[:, b], None if inp.token_ids is None else inp.token_ids[b],
                    None if inp.attention_mask is None else inp.attention_mask[b],
                    None if inp.scored is None else inp.scored[b]))
            per_layer = []
            for li, L in enumerate(layers):
                cl = model_layers[L]
                index = L if inp.hidden.shape[0] > 1 else 0
                if index >= inp.hidden.shape[0]:
                    raise InputError(f"holds the states of {inp.hidden.shape[0]} layers; the model has {count}", where)
                lay = cl.problem(inp.layer_input(index), from_residual=residual, padding=~inp.valid(),
                                 options=cl.config_options(Options(dtype=dtype)))
                prep = engine.prepare(lay, be)
                s, c = hs.layer_sums(prep, inp.sequences(), exclude_first=exclude_first, exclude_self=exclude_self)
                sums.add_layer(li, s, c)
                if rollout is not None:
                    per_layer.append(list(hs.mean_weights(prep)))  # (B, T, T): one per input
                if progress is not None:
                    progress(k * len(layers) + li + 1, len(sources) * len(layers))
            if rollout is not None:
                rolled.extend(hs.rollout([per_layer[li][b] for li in range(len(layers))]) for b in range(inp.batch))
    settings = {"exclude_first": exclude_first, "exclude_self": exclude_self, "dtype": dtype,
                "probe": None if induction is None else {"kind": "induction", "n": induction}}  # the seed draws inputs:
    # runs with other seeds measured other inputs, and merge
    doc = headsfile.document(sums, layers=layers, heads=heads, model=headsfile.model_identity(weights),
                             thresholds=limits, settings=settings, inputs=hashes, with_sums=True)
    if rollout is not None:
        _save_rollout(rollout, rolled, args)
        doc["rollout"] = {"file": str(rollout), "caveat": hs.ROLLOUT_CAVEAT}
        if not quiet:
            sys.stderr.write(f"attncli: note: {hs.ROLLOUT_CAVEAT}\n")
    return doc


def _measure_cross(args: list[str], weights: str | None, prefix: str | None, layer: str | None, exclude_first: bool,
                   limits: dict[str, float], dtype: str, quiet: bool, be: Any = None) -> dict[str, Any]:
    """--cross: each decoder layer's cross-attention over captures made with --target, its queries the input the
    capture kept of it (cross_inputs), its keys the encoder's output; the queries are the decoder's valid tokens,
    the keys the encoder's (special tokens and punctuation from the encoder's side)."""
    from attncli.cli.run import progress_bar
    from attncli.core import engine
    from attncli.core import headstats as hs
    from attncli.core.backend import get_backend
    from attncli.core.options import Options
    from attncli.io import headsfile
    from attncli.io.capture import capture_from, is_capture
    from attncli.io.cross import load_cross_layer
    from attncli.io.files import Reader

    if weights is None:
        raise InputError("needs the model: --weights MODEL_FOLDER (its config.json and weights)", "--weights")
    if not args:
        raise InputError("give captures made with --target (attncli capture MODEL TEXT --target TEXT -o C.npz)",
                         "--cross")
    single = None
    if layer is not None and layer.strip().lower() != "all":
        t = layer.strip()
        if not t.isdigit():
            raise InputError(f"must be a decoder layer number or all, got {t[:40]!r}", "--layer")
        single = int(t)
    be = be or get_backend("numpy")
    sums: hs.Sums | None = None
    layers: list[int] = []
    heads = 0
    hashes: list[str] = []
    loaded: dict[int, Any] = {}
    with progress_bar(quiet) as progress:
        for k, spec in enumerate(args):
            reader = Reader()
            content, src = reader.read(spec), reader.source(spec)
            if not is_capture(content):
                raise InputError("--cross measures captures made with --target (format "
                                 f"{CAPTURE_FORMAT!r})", src)
            cap = capture_from(content, src)
            dec = cap.decoder
            if dec is None or cap.cross_inputs is None:
                raise InputError("holds no decoder: --cross needs a capture of an encoder-decoder model taken with "
                                 "--target", src)
            kept = list(dec.state_layers) if dec.state_layers is not None else \
                list(range(dec.hidden_states.shape[0] - 1))
            want = kept if single is None else [single]
            if single is not None and single not in kept:
                raise InputError(f"holds the cross-attention inputs of decoder layers {kept}, not layer {single}", src)
            if sums is None:
                layers = want
            elif want != layers:
                raise InputError(f"holds decoder layers {kept}; the first capture measured {layers}", src)
            memory = np.asarray(cap.hidden_states[-1])  # the encoder's output, which every cross-attention reads
            enc_valid = np.asarray(cap.attention_mask) != 0
            dec_valid = np.asarray(dec.attention_mask) != 0
            queries = [hs.Sequence(dec_valid[b]) for b in range(dec_valid.shape[0])]
            keys = hs.Inputs(memory[None], labels=cap.labels, attention_mask=cap.attention_mask,
                             special_tokens_mask=cap.special_tokens_mask).sequences()
            for b in range(dec_valid.shape[0]):
                hashes.append(headsfile.input_hash(memory[b], np.asarray(cap.input_ids[b]),
                                                   np.asarray(cap.attention_mask[b]),
                                                   np.asarray(dec.input_ids[b])))
            for li, L in enumerate(layers):
                if L not in loaded:
                    loaded[L] = load_cross_layer(weights, L, prefix)
                cl = loaded[L]
                x = np.asarray(cap.cross_inputs[kept.index(L)])
                lay = cl.problem(x, memory, batch_first=True, padding=~enc_valid,
                                 options=cl.config_options(Options(dtype=dtype)))
                if sums is None:
                    heads = int(cl.heads or 0)
                    sums = hs.Sums.zeros(len(layers), heads)
                s, c = hs.layer_sums(engine.prepare(lay, be), queries, exclude_first=exclude_first, keys=keys)
                sums.add_layer(li, s, c)
                if progress is not None:
                    progress(k * len(layers) + li + 1, len(args) * len(layers))
    assert sums is not None
    settings = {"exclude_first": exclude_first, "exclude_self": False, "dtype": dtype, "probe": None,
                "cross": True}
    return headsfile.document(sums, layers=layers, heads=heads, model=headsfile.model_identity(weights),
                              thresholds=limits, settings=settings, inputs=hashes, with_sums=True)


def _save_rollout(path: Path, per_input: list[np.ndarray], protect: list[str]) -> None:
    from attncli.io.files import atomic_write

    if path.suffix.lower() != ".npy":
        raise InputError("rollout is saved as .npy (inputs, layers, T, T)", str(path))
    with atomic_write(path, protect=protect) as f:
        np.save(f, np.stack(per_input), allow_pickle=False)


def _probe(weights: str, cl: Any, n: int, seed: int) -> Inputs:
    from attncli.core import headstats as hs
    from attncli.io import forward

    cfg = cl.raw.config if hasattr(cl.raw, "config") else None
    if cfg is None:
        from attncli.io.checkpoint import open_checkpoint

        cfg = open_checkpoint(weights).config or {}
    bos, vocab = cfg.get("bos_token_id"), cfg.get("vocab_size")
    if isinstance(bos, list):
        bos = bos[0] if bos else None
    if not isinstance(bos, int) or not isinstance(vocab, int):
        raise InputError("the probe starts with the BOS token: config.json needs bos_token_id and vocab_size",
                         "--induction")
    avoid = {t for k in ("bos_token_id", "eos_token_id", "pad_token_id") for t in _ids(cfg.get(k))}
    ids, scored = hs.induction_probe(bos, vocab, n, PROBE_BATCH, seed, avoid)
    return hs.Inputs(forward.hidden_states(weights, ids), token_ids=ids, scored=scored)


def _ids(v: Any) -> list[int]:
    return [x for x in (v if isinstance(v, list) else [v]) if isinstance(x, int)]


def _read_input(reader: Any, spec: str, single: int | None, count: int) -> Inputs:
    """HIDDEN, X or a capture as Inputs (hidden (L + 1, B, T, E), or (1, B, T, E) for X of one layer)."""
    from attncli.core import headstats as hs
    from attncli.io.capture import capture_from, is_capture

    content = reader.read(spec)
    src = reader.source(spec)
    if is_capture(content):
        return _from_capture(capture_from(content, src))
    if isinstance(content, dict):
        raise InputError("is a mapping; heads takes an array (HIDDEN or X) or a capture (format "
                         f"{CAPTURE_FORMAT!r})", src)
    a = np.asarray(content)
    if a.dtype.kind not in "fiu":
        raise InputError(f"holds {a.dtype}; expected numbers", src)
    if not np.isfinite(a).all():
        raise InputError("holds NaN or an infinity", src)
    if single is None:
        if a.ndim == 3:
            a = a[:, None]
        if a.ndim != 4:
            raise InputError(f"HIDDEN is (layers + 1, [B,] T, E); got shape {a.shape}", src)
        if a.shape[0] < count:
            raise InputError(f"holds the states entering {a.shape[0]} layers; the model has {count} (--layer N for "
                             "one)", src)
        return hs.Inputs(a)
    if a.ndim == 4:  # HIDDEN with --layer N
        return hs.Inputs(a[single:single + 1])
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3:
        raise InputError(f"X is (T, E) or (B, T, E); got shape {a.shape}", src)
    return hs.Inputs(a[None], residual=False)


def _from_capture(cap: Any) -> Inputs:
    """A capture (attncli.io.capture.Capture, issue 31) as Inputs: its residual stream, ids, labels, padding and
    special tokens."""
    from attncli.core import headstats as hs

    return hs.Inputs(np.asarray(cap.hidden_states), token_ids=cap.input_ids, labels=cap.labels,
                     attention_mask=cap.attention_mask, special_tokens_mask=cap.special_tokens_mask)


# ---- merging -----------------------------------------------------------------------------------------------------


def _merge(paths: list[str], limits: dict[str, float] | None) -> dict[str, Any]:
    from attncli.io import headsfile
    from attncli.io.files import Reader

    if len(paths) < 1:
        raise InputError("merge takes statistics files: attncli heads merge A.json B.json ... --save all.json",
                         "arguments")
    reader = Reader()
    files = []
    for p in paths:
        content = reader.read(p)
        doc, sums = headsfile.read(reader.source(p), content)
        files.append((reader.source(p), doc, sums))
    first, sums, inputs = headsfile.merge(files)
    return headsfile.document(sums, layers=first["layers"], heads=first["heads"], model=first["model"],
                              thresholds=limits or headsfile.limits_of(first), settings=first["settings"],
                              inputs=inputs, with_sums=True)


# ---- output ------------------------------------------------------------------------------------------------------


def _emit(doc: dict[str, Any], fmt: str, metric: str | None, top: int | None, plot: Path | None,
          save: Path | None, protect: list[str]) -> None:
    from attncli.core import headstats as hs
    from attncli.io.files import atomic_write
    from attncli.render import heads as show

    if save is not None:
        with atomic_write(save, protect=protect) as f:
            f.write(json.dumps(doc, allow_nan=False).encode())
    if plot is not None:
        kind = plot.suffix.lower().lstrip(".")
        if kind not in ("png", "pdf", "svg"):
            raise InputError("--plot writes .png, .pdf or .svg", str(plot))
        with atomic_write(plot, protect=protect) as f:
            show.plot(doc, f, kind, list(hs.STATS))
    out = {k: v for k, v in doc.items() if k != "sums"}
    if top is not None and metric is not None and fmt != "table":  # the K heads highest on the metric, in order
        ranked = sorted((r for r in out["statistics"] if r[metric]["mean"] is not None),
                        key=lambda r: (-r[metric]["mean"], r["layer"], r["head"]))
        out["statistics"], out["top"] = ranked[:top], {"metric": metric, "k": top}
    if fmt == "json":
        sys.stdout.write(json.dumps(out, allow_nan=False, indent=1) + "\n")
    elif fmt == "csv":
        sys.stdout.write(show.csv_text(out, list(hs.STATS)))
    else:
        from rich.console import Console

        console = Console(soft_wrap=False, markup=False, emoji=False, highlight=False)
        if top is not None and metric is not None:
            show.top(out, console, metric, top)
        else:
            show.table(out, console, metric)
