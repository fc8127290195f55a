"""From command-line arguments and files to a validated Problem."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from attncli.errors import InputError
from attncli.io import LOADERS, STDIN, Reader
from attncli.problem import Options, Problem

OPTION_FIELDS = Options.field_names()
PROBLEM_KEYS = {"q", "k", "v", "valid_lens", "mask", "labels", "query_labels", "key_labels", "options",
                "weights", "expected", "description", "source"}


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


def cli_options(opts: dict[str, Any]) -> dict[str, Any]:
    """The computation options given on the command line (enums to their values)."""
    out = {}
    for k, v in opts.items():
        if k in OPTION_FIELDS and v is not None:
            out[k] = v.value if isinstance(v, Enum) else v
    return out


def build_problem(inputs: list[str], opts: dict[str, Any], reader: Reader) -> Problem:
    """The Problem described by 1–3 input files (or ``-``) and the shared options.

    One input: a problem file (a mapping with q, k, v, ...) or one matrix used as Q, K and V.
    Two: Q and K (also used as V). Three: Q, K, V. Command-line options override the file's.
    """
    if not 1 <= len(inputs) <= 3:
        raise InputError(f"expected 1 to 3 inputs (Q [K [V]]), got {len(inputs)}", "arguments")
    content = reader.read(inputs[0])
    from_file: dict[str, Any] = {}
    file_source = reader.source(inputs[0])
    if isinstance(content, dict) and "q" in content:
        from_file = content
        unknown = set(map(str, content)) - PROBLEM_KEYS
        if unknown and not Path(inputs[0]).suffix.lower() == ".npz":
            raise InputError(f"has unknown entries {', '.join(sorted(unknown))}; "
                             f"a problem file holds {', '.join(sorted(PROBLEM_KEYS))}", file_source)
    slots = ("q", "k", "v")
    sources: dict[str, str] = {}
    arrays: dict[str, Any] = {}
    fallbacks = {"q": (), "k": ("q",), "v": ("k", "q")}  # in a problem file K defaults to Q, V to K
    for slot, spec in zip(slots, inputs):
        arrays[slot] = reader.array(spec, slot, fallbacks[slot])
        sources[slot] = reader.source(spec)
    if from_file and len(inputs) == 1:
        for slot in ("k", "v"):
            if slot in from_file:
                arrays[slot] = from_file[slot]
                sources[slot] = file_source
    # shorthand: K defaults to Q, V to K
    arrays.setdefault("k", arrays["q"])
    sources.setdefault("k", sources["q"])
    arrays.setdefault("v", arrays["k"])
    sources.setdefault("v", sources["k"])

    valid_lens, mask = from_file.get("valid_lens"), from_file.get("mask")
    sources["valid_lens"] = sources["mask"] = file_source
    if opts.get("valid_lens") is not None:
        valid_lens, sources["valid_lens"] = parse_valid_lens(opts["valid_lens"], reader)
    if opts.get("mask") is not None:
        mask, sources["mask"] = reader.array(opts["mask"], "mask"), reader.source(opts["mask"])

    # `labels` name the queries, and the keys too when there are as many (self-attention)
    both = _labels(from_file.get("labels"), file_source)
    if opts.get("labels"):
        both = split_labels(opts["labels"])
        sources["query_labels"] = sources["key_labels"] = "--labels"
    n_keys = _rows(arrays["k"])
    qlab = _labels(from_file.get("query_labels"), file_source) or both
    klab = _labels(from_file.get("key_labels"), file_source) or (both if both and len(both) == n_keys else None)
    if opts.get("query_labels"):
        qlab, sources["query_labels"] = split_labels(opts["query_labels"]), "--query-labels"
    if opts.get("key_labels"):
        klab, sources["key_labels"] = split_labels(opts["key_labels"]), "--key-labels"
    sources.setdefault("query_labels", file_source)
    sources.setdefault("key_labels", file_source)

    options = Options().merged(_file_options(from_file.get("options"), file_source), file_source)
    options = options.merged(cli_options(opts), "command line", flags=True)
    params, sources["weights"] = _score_weights(from_file.get("weights"), file_source, opts.get("weights"), reader)
    return Problem.build(arrays["q"], arrays["k"], arrays["v"], valid_lens=valid_lens, mask=mask,
                         query_labels=qlab, key_labels=klab, options=options, sources=sources, params=params)


def _score_weights(in_file: Any, file_source: str, path: Any, reader: Reader) -> tuple[dict[str, Any], str]:
    """Score weights from ``--weights FILE`` (which wins) or the problem file's ``weights:`` mapping."""
    from attncli.weights import weights_mapping

    if path is not None:
        spec = str(path)
        return weights_mapping(reader.read(spec), reader.source(spec)), reader.source(spec)
    if in_file is None:
        return {}, file_source
    return weights_mapping(in_file, file_source), file_source
