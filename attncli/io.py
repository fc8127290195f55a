"""Reading arrays and problem files (.npy .npz .yaml/.yml .json .csv/.txt, or ``-``) and
writing outputs atomically. Never loads pickles.

A file holds either one array (an .npy, a nested list in YAML/JSON, a CSV table) or a
mapping of named entries (an .npz, a YAML/JSON mapping): a "problem" with ``q``, ``k``,
``v``, ``valid_lens``, ``mask``, ``labels`` / ``query_labels`` / ``key_labels``,
``options`` (and ``weights``, ``expected``).
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np

from attncli.errors import InputError

STDIN = "-"
Content = Any  # np.ndarray | dict[str, Any] | list


# ---- loaders: a registry by file extension ----------------------------------------------

Loader = Callable[[bytes, str], Content]
LOADERS: dict[str, Loader] = {}


def loader(*exts: str) -> Callable[[Loader], Loader]:
    def deco(fn: Loader) -> Loader:
        for e in exts:
            LOADERS[e] = fn
        return fn

    return deco


def _text(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"is not UTF-8 text (byte {e.start}); expected {Path(source).suffix or 'text'} data", source) from None


@loader(".npy")
def load_npy(data: bytes, source: str) -> np.ndarray:
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as e:
        if "pickle" in str(e):
            raise InputError("holds an object array that needs pickle to load; pickles are never loaded "
                             "(save a numeric array instead)", source) from None
        raise InputError(f"is not a valid .npy file ({_one_line(e)})", source) from None
    except (OSError, EOFError) as e:
        raise InputError(f"is not a valid .npy file ({_one_line(e)})", source) from None


@loader(".npz")
def load_npz(data: bytes, source: str) -> dict[str, Any]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            out: dict[str, Any] = {}
            for name in z.files:
                out[name] = z[name]
            return out
    except ValueError as e:
        if "pickle" in str(e):
            raise InputError("holds an object array that needs pickle to load; pickles are never loaded", source) from None
        raise InputError(f"is not a valid .npz file ({_one_line(e)})", source) from None
    except (OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise InputError(f"is not a valid .npz file ({_one_line(e)})", source) from None


@loader(".yaml", ".yml")
def load_yaml(data: bytes, source: str) -> Content:
    import yaml

    text = _text(data, source)
    try:
        doc = yaml.safe_load(text)
    except yaml.constructor.ConstructorError as e:
        tag = getattr(e, "problem", "") or ""
        raise InputError(f"holds a YAML tag that is not plain data ({_one_line(tag)}); only plain data is read", source) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or _one_line(e)
        raise InputError(f"is not valid YAML{where}: {problem}", source) from None
    except RecursionError:
        raise InputError("is nested too deeply to read", source) from None
    if doc is None:
        raise InputError("is empty: expected an array or a mapping with q, k, v", source)
    return doc


@loader(".json")
def load_json(data: bytes, source: str) -> Content:
    text = _text(data, source)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"is not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}", source) from None
    except RecursionError:
        raise InputError("is nested too deeply to read", source) from None
    return doc


@loader(".csv", ".txt", ".tsv")
def load_csv(data: bytes, source: str) -> np.ndarray:
    text = _text(data, source)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise InputError("is empty: expected rows of numbers", source)
    delim = "," if "," in lines[0] else "\t" if "\t" in lines[0] else None
    rows = []
    for i, ln in enumerate(lines, 1):
        cells = [c.strip() for c in (ln.split(delim) if delim else ln.split())]
        try:
            rows.append([float(c) for c in cells])
        except ValueError:
            bad = next(c for c in cells if not _is_float(c))
            raise InputError(f"row {i} holds {bad[:40]!r}, which is not a number", source) from None
    widths = {len(r) for r in rows}
    if len(widths) > 1:
        raise InputError(f"is ragged: rows have {sorted(widths)} columns", source)
    return np.asarray(rows, dtype=np.float64)


def _is_float(c: str) -> bool:
    try:
        float(c)
        return True
    except ValueError:
        return False


def _one_line(e: object) -> str:
    return " ".join(str(e).split())[:200]


@loader(".pt", ".pth")
def load_torch(data: bytes, source: str) -> dict[str, Any]:
    """A PyTorch state dict (or a dict of tensors), loaded with ``weights_only=True``."""
    from attncli.backend import TORCH_HINT, torch_available

    if not torch_available():
        raise InputError(f"is a PyTorch file, and reading it needs PyTorch; {TORCH_HINT}", source)
    import pickle

    import torch

    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise InputError("holds Python objects beyond tensors (a whole pickled model?); only state dicts are read, "
                         "with weights_only=True: save model.state_dict() instead", source) from None
    except (RuntimeError, EOFError, ValueError, AttributeError, TypeError) as e:
        raise InputError(f"is not a PyTorch state dict that loads with weights_only=True ({_one_line(e)[:160]})",
                         source) from None
    if isinstance(obj, torch.Tensor):
        return {"tensor": obj.detach().cpu().numpy()}
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise InputError(f"holds a {type(obj).__name__}, not a state dict of tensors", source)
    return {str(k): v.detach().cpu().float().numpy() if v.dtype == torch.bfloat16 else v.detach().cpu().numpy()
            for k, v in obj.items()}


def sniff(data: bytes) -> str:
    """The extension whose loader fits bytes read from stdin."""
    if data.startswith(b"\x93NUMPY"):
        return ".npy"
    if data.startswith(b"PK"):
        return ".npz"
    head = data.lstrip()[:1]
    if head in (b"[", b"{"):
        return ".json"
    first = data.lstrip().split(b"\n", 1)[0]
    try:
        float(first.replace(b",", b" ").split()[0])
        return ".csv"
    except (ValueError, IndexError):
        return ".yaml"


# ---- reading --------------------------------------------------------------------------

class Reader:
    """Reads files (and stdin, at most once: later reads of ``-`` reuse it), caching contents."""

    def __init__(self, stdin: IO[bytes] | None = None) -> None:
        self._stdin = stdin
        self._cache: dict[str, Content] = {}

    def read(self, spec: str) -> Content:
        if spec not in self._cache:
            self._cache[spec] = self._read(spec)
        return self._cache[spec]

    def _read(self, spec: str) -> Content:
        if spec == STDIN:
            stream = self._stdin or sys.stdin.buffer
            data = stream.read()
            if not data.strip():
                raise InputError("is empty: nothing was piped in", "<stdin>")
            return LOADERS[sniff(data)](data, "<stdin>")
        path = Path(spec)
        ext = path.suffix.lower()
        if ext not in LOADERS:
            raise InputError(f"has an unknown extension {ext or '(none)'!r}; "
                             f"expected one of {', '.join(sorted(LOADERS))} or - for stdin", spec)
        if not path.exists():
            raise InputError("no such file", spec)
        if path.is_dir():
            raise InputError("is a directory, not a file", spec)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise InputError(f"cannot be read ({e.strerror})", spec) from None
        if not data.strip():
            raise InputError("is empty", spec)
        return LOADERS[ext](data, spec)

    def source(self, spec: str) -> str:
        return "<stdin>" if spec == STDIN else spec

    def array(self, spec: str, name: str, fallbacks: tuple[str, ...] = ()) -> Any:
        """The array for slot ``name`` (q, k, v, mask, ...) from ``spec``: the file's one array,
        or, when the file is a mapping, its entry ``name`` (else the first of ``fallbacks``)."""
        content = self.read(spec)
        if isinstance(content, dict):
            for key in (name, *fallbacks):
                if key in content:
                    return content[key]
            arrays = [k for k, v in content.items() if not isinstance(v, (str, dict))]
            if len(arrays) == 1:
                return content[arrays[0]]
            raise InputError(f"has no entry {name!r} (it has {', '.join(map(str, content)) or 'none'})", self.source(spec))
        return content


# ---- writing --------------------------------------------------------------------------

@contextmanager
def atomic_write(path: str | os.PathLike[str], protect: Iterable[str] = ()) -> Iterator[IO[bytes]]:
    """Write ``path`` through a temporary file in the same folder, renamed into place only
    when the block succeeds: an error or Ctrl-C leaves no partial file. Refuses to write
    over one of the ``protect``ed inputs."""
    target = Path(path)
    for p in protect:
        if p != STDIN and Path(p).exists() and target.exists() and target.resolve() == Path(p).resolve():
            raise InputError("is one of the inputs; refusing to overwrite it", str(path))
    if target.is_dir():
        raise InputError("is a directory; give a file name to save to", str(path))
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"cannot be written: folder {str(folder)!r} does not exist", str(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
