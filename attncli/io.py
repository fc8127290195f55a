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
import math
import os
import struct
import sys
import tempfile
import zipfile
import zlib
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
        raise InputError(f"is not UTF-8 text (byte {e.start}); expected {Path(source).suffix or 'text'} data",
                         source) from None


# Text formats (YAML/JSON) are for small, hand-written problems: a document that expands to
# more numbers than this (e.g. a YAML alias bomb, "billion laughs") is refused before numpy sees it.
MAX_TEXT_ITEMS = 10_000_000
# Parsing text builds a Python object per number (PyYAML: about 1 KB and 35 µs each), so text
# files are read up to these sizes; larger arrays belong in .npy (memory-mapped) files.
MAX_YAML_BYTES = 4 << 20
MAX_TEXT_BYTES = 64 << 20


def check_text_bytes(data: bytes, source: str, limit: int, what: str, size: int | None = None) -> None:
    size = len(data) if size is None else size
    if size > limit:
        raise InputError(f"is {_size(size)} of {what}; {what} inputs are read up to {_size(limit)} "
                         "(save large arrays as .npy instead)", source)


TEXT_LIMITS = {".yaml": (MAX_YAML_BYTES, "YAML"), ".yml": (MAX_YAML_BYTES, "YAML"), ".json": (MAX_TEXT_BYTES, "JSON"),
               ".csv": (MAX_TEXT_BYTES, "CSV"), ".tsv": (MAX_TEXT_BYTES, "CSV"), ".txt": (MAX_TEXT_BYTES, "CSV")}


def memory_limit() -> int:
    """Bytes an array read into memory may take: the machine's free physical memory now (a
    declared size above it is refused before anything is allocated or decompressed)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def check_npy_header(f: IO[bytes], available: int, source: str, what: str = ".npy file",
                     memory: int | None = None) -> int:
    """Read an .npy header from ``f`` and check that the data it declares fits in the
    ``available`` bytes after it (and in ``memory`` bytes, for data that will be decompressed
    into memory): a truncated file or one declaring an enormous shape fails here, fast,
    instead of allocating. Leaves ``f`` after the header; returns the bytes of data declared."""
    start = f.tell()
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    except Exception as e:  # numpy parses the header with tokenize/ast: ValueError, SyntaxError, TokenError...
        raise InputError(f"is not a valid {what} ({_one_line(e)})", source) from None
    if dtype.hasobject:
        raise InputError("holds an object array that needs pickle to load; pickles are never loaded "
                         "(save a numeric array instead)", source)
    count = math.prod(int(x) for x in shape)
    need, have = count * dtype.itemsize, available - (f.tell() - start)
    if need > have:
        raise InputError(f"is truncated or corrupt: its header declares shape {tuple(shape)} {dtype} "
                         f"({_size(need)}) but only {_size(max(have, 0))} of data follow", source)
    if memory is not None and need > memory:
        raise InputError(f"declares shape {tuple(shape)} ({_size(need)}), more than this machine's free memory "
                         f"({_size(memory)}); save it as an .npy file, which is memory-mapped", source)
    return need


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} bytes"


@loader(".npy")
def load_npy(data: bytes, source: str) -> np.ndarray:
    check_npy_header(io.BytesIO(data), len(data), source)
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as e:
        if "pickle" in str(e):
            raise InputError("holds an object array that needs pickle to load; pickles are never loaded "
                             "(save a numeric array instead)", source) from None
        raise InputError(f"is not a valid .npy file ({_one_line(e)})", source) from None
    except (OSError, EOFError) as e:
        raise InputError(f"is not a valid .npy file ({_one_line(e)})", source) from None


# Loaders that read a file on disk themselves (stdin still goes through LOADERS, in memory).
FileLoader = Callable[[Path, str], Content]
FILE_LOADERS: dict[str, FileLoader] = {}


def file_loader(*exts: str) -> Callable[[FileLoader], FileLoader]:
    def deco(fn: FileLoader) -> FileLoader:
        for e in exts:
            FILE_LOADERS[e] = fn
        return fn

    return deco


@file_loader(".npy")
def map_npy(path: Path, source: str) -> np.ndarray:
    """An .npy file memory-mapped read-only: a large input is paged in as the engine reads it."""
    try:
        size = path.stat().st_size
        if size == 0:
            raise InputError("is empty", source)
        with open(path, "rb") as f:
            check_npy_header(f, size, source)
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except InputError:
        raise
    except OSError as e:
        raise InputError(f"cannot be read ({e.strerror or _one_line(e)})", source) from None
    except ValueError as e:
        raise InputError(f"is not a valid .npy file ({_one_line(e)})", source) from None


@loader(".npz")
def load_npz(data: bytes, source: str) -> dict[str, Any]:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            total, free = 0, memory_limit()
            for info in zf.infolist():  # check each array's declared shape before numpy allocates it
                if info.is_dir():
                    continue
                with zf.open(info) as member:
                    if member.read(6) != b"\x93NUMPY":  # numpy reads any member with this magic as an array
                        continue
                with zf.open(info) as member:
                    name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                    total += check_npy_header(member, info.file_size, f"{source}[{name}]", "array", memory=free)
                if total > free:  # e.g. many members that share one compressed stream
                    raise InputError(f"holds arrays of {_size(total)} in all, more than this machine's free memory "
                                     f"({_size(free)})", source)
    except InputError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError,
            RuntimeError, zlib.error, struct.error) as e:
        raise InputError(f"is not a valid .npz file ({_one_line(e)})", source) from None
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            out: dict[str, Any] = {}
            for name in z.files:
                out[name] = z[name]
            return out
    except ValueError as e:
        if "pickle" in str(e):
            raise InputError("holds an object array that needs pickle to load; pickles are never loaded",
                             source) from None
        raise InputError(f"is not a valid .npz file ({_one_line(e)})", source) from None
    except (OSError, EOFError, zipfile.BadZipFile, KeyError, NotImplementedError, RuntimeError, zlib.error,
            struct.error) as e:
        raise InputError(f"is not a valid .npz file ({_one_line(e)})", source) from None


@loader(".yaml", ".yml")
def load_yaml(data: bytes, source: str) -> Content:
    import yaml

    check_text_bytes(data, source, MAX_YAML_BYTES, "YAML")
    text = _text(data, source)
    try:
        doc = yaml.load(text, Loader=_yaml_loader())
    except yaml.constructor.ConstructorError as e:
        tag = getattr(e, "problem", "") or ""
        raise InputError(f"holds a YAML tag that is not plain data ({_one_line(tag)}); only plain data is read",
                         source) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or _one_line(e)
        raise InputError(f"is not valid YAML{where}: {problem}", source) from None
    except RecursionError:
        raise InputError("is nested too deeply to read", source) from None
    except (ValueError, OverflowError) as e:  # e.g. an integer of more than 4300 digits
        raise InputError(f"holds a value that cannot be read ({_one_line(e)[:120]})", source) from None
    if doc is None:
        raise InputError("is empty: expected an array or a mapping with q, k, v", source)
    check_text_size(doc, source)
    return doc


_YAML_LOADER: Any = None


def _yaml_loader() -> Any:
    """yaml.SafeLoader that also reads YAML 1.2 floats such as ``1e3`` and ``.5`` as numbers
    (YAML 1.1 wants ``1.0e+3``). Built once, on first use (yaml is imported lazily).

    Deliberately not the faster libyaml ``CSafeLoader``: it recurses in C and crashes
    (SIGSEGV) on 100,000 nested brackets, where the pure-Python one raises RecursionError."""
    global _YAML_LOADER
    if _YAML_LOADER is None:
        import re

        import yaml

        class Loader(yaml.SafeLoader):
            pass

        Loader.add_implicit_resolver(
            "tag:yaml.org,2002:float",
            re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
            list("-+0123456789."))
        _YAML_LOADER = Loader
    return _YAML_LOADER


def check_text_size(doc: Any, source: str, limit: int = MAX_TEXT_ITEMS) -> None:
    """Refuse a YAML/JSON document that expands to more than ``limit`` values. YAML aliases
    share one object, so a small file can stand for 10**9 numbers ("billion laughs"); the
    count is memoised by object, so this check itself stays linear in the file."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(doc, False)]
    while stack:
        node, done = stack.pop()
        if not isinstance(node, (list, dict)) or (id(node) in sizes and not done):
            continue
        children = list(node.values()) if isinstance(node, dict) else node
        if not done:
            sizes[id(node)] = 0  # placeholder: a node that contains itself counts once
            stack.append((node, True))
            stack.extend((c, False) for c in children)
            continue
        total = len(children) + sum(sizes.get(id(c), 0) for c in children if isinstance(c, (list, dict)))
        sizes[id(node)] = total
        if total > limit:
            raise InputError(f"expands to more than {limit:,} values (YAML aliases?); "
                             "save large arrays as .npy instead", source)


@loader(".json")
def load_json(data: bytes, source: str) -> Content:
    check_text_bytes(data, source, MAX_TEXT_BYTES, "JSON")
    text = _text(data, source)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"is not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}", source) from None
    except RecursionError:
        raise InputError("is nested too deeply to read", source) from None
    except (ValueError, OverflowError) as e:  # e.g. an integer of more than 4300 digits
        raise InputError(f"holds a value that cannot be read ({_one_line(e)[:120]})", source) from None
    check_text_size(doc, source)
    return doc


@loader(".csv", ".txt", ".tsv")
def load_csv(data: bytes, source: str) -> np.ndarray:
    check_text_bytes(data, source, MAX_TEXT_BYTES, "CSV")
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
    import warnings

    import torch

    if not (data.startswith(b"PK") or data.startswith(b"\x80")):  # torch.save: a zip, or a legacy pickle
        raise InputError("is not a PyTorch file (torch.save writes a zip archive)", source)
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": one line on stderr, not two
            warnings.simplefilter("ignore")
            obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise InputError("holds Python objects beyond tensors (a whole pickled model?); only state dicts are read, "
                         "with weights_only=True: save model.state_dict() instead", source) from None
    except Exception as e:  # torch.load on damaged bytes raises almost anything (IndexError, KeyError...)
        raise InputError(f"is not a PyTorch state dict that loads with weights_only=True ({_one_line(e)[:160]})",
                         source) from None
    if isinstance(obj, torch.Tensor):
        return {"tensor": _tensor_array(obj, "tensor", source)}
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise InputError(f"holds a {type(obj).__name__}, not a state dict of tensors", source)
    return {str(k): _tensor_array(v, str(k), source) for k, v in obj.items()}


def _tensor_array(t: Any, name: str, source: str) -> Any:
    """One tensor of a state dict on the host as numpy: sparse made dense, quantized dequantized
    (bfloat16 arrives as float32 marked BFloat16Values, computed in float32)."""
    from attncli.backend import host_array

    try:
        if str(t.layout) != "torch.strided":  # sparse COO/CSR...
            t = t.to_dense()
        if t.is_quantized:
            t = t.dequantize()
        return host_array(t)
    except Exception as e:  # meta, nested or other tensors that have no numbers on the host
        raise InputError(f"tensor {name!r} cannot be read as numbers ({_one_line(e)[:120]})", source) from None


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

def read_bounded(stream: IO[bytes], limit: int, source: str = "<stdin>", chunk: int = 1 << 20) -> bytes:
    """All of ``stream``, or a one-line InputError once it passes ``limit`` bytes (so that
    ``cat /dev/zero | attncli run -`` stops instead of filling the memory)."""
    parts: list[bytes] = []
    size = 0
    while True:
        part = stream.read(chunk)
        if not part:
            return b"".join(parts)
        parts.append(part)
        size += len(part)
        if size > limit:
            raise InputError(f"{'sent' if source == '<stdin>' else 'holds'} more than {_size(limit)}; save large "
                             "arrays to an .npy file and give its name instead", source)

class Reader:
    """Reads files (and stdin, at most once: later reads of ``-`` reuse it), caching contents."""

    def __init__(self, stdin: IO[bytes] | None = None) -> None:
        self._stdin = stdin
        self._cache: dict[str, Content] = {}
        self.paths: list[str] = []  # the files read so far (not stdin)

    def read(self, spec: str) -> Content:
        if spec not in self._cache:
            self._cache[spec] = self._read(spec)
        return self._cache[spec]

    def _read(self, spec: str) -> Content:
        if spec == STDIN:
            stream = self._stdin or sys.stdin.buffer
            data = read_bounded(stream, memory_limit() // 2)
            if not data.strip():
                raise InputError("is empty: nothing was piped in", "<stdin>")
            return LOADERS[sniff(data)](data, "<stdin>")
        path = Path(spec)
        self.paths.append(spec)  # every file read, so that outputs never overwrite one of them
        ext = path.suffix.lower()
        if ext not in LOADERS:
            raise InputError(f"has an unknown extension {ext or '(none)'!r}; "
                             f"expected one of {', '.join(sorted(LOADERS))} or - for stdin", spec)
        if not path.exists():
            raise InputError("no such file", spec)
        if path.is_dir():
            raise InputError("is a directory, not a file", spec)
        if ext in FILE_LOADERS:
            return FILE_LOADERS[ext](path, spec)
        try:
            limit, what = TEXT_LIMITS.get(ext, (memory_limit() // 2, ""))
            size = path.stat().st_size  # checked before reading: a huge file is refused unread
            if what:
                check_text_bytes(b"", spec, limit, what, size)
            elif size > limit:
                raise InputError(f"is {_size(size)}, more than half the free memory; save large arrays as .npy", spec)
            with open(path, "rb") as f:  # bounded too: a FIFO or device has no size to check
                data = read_bounded(f, max(limit, 1), spec)
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
            raise InputError(f"has no entry {name!r} (it has {', '.join(map(str, content)) or 'none'})",
                             self.source(spec))
        return content


# ---- writing --------------------------------------------------------------------------

def _same_file(a: Path, b: Path) -> bool:
    """The same file, through a symlink, a hard link or another spelling of its path."""
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    except OSError:
        return False


@contextmanager
def atomic_write(path: str | os.PathLike[str], protect: Iterable[str] = ()) -> Iterator[IO[bytes]]:
    """Write ``path`` through a temporary file in the same folder, renamed into place only
    when the block succeeds: an error or Ctrl-C leaves no partial file. Refuses to write
    over one of the ``protect``ed inputs."""
    target = Path(path)
    for p in protect:
        if p != STDIN and Path(p).exists() and target.exists() and _same_file(Path(p), target):
            raise InputError("is one of the inputs; refusing to overwrite it", str(path))
    if target.is_dir():
        raise InputError("is a directory; give a file name to save to", str(path))
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"cannot be written: folder {str(folder)!r} does not exist", str(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as e:  # a read-only or full folder: the user's to fix, not an internal error
        raise InputError(f"cannot be written ({e.strerror or _one_line(e)})", str(path)) from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # as open() would create it, not mkstemp's 0600
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, target)
    except OSError as e:  # e.g. no space left on device
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"cannot be written ({e.strerror or _one_line(e)})", str(path)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
