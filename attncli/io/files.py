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
import re
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

from attncli.errors import InputError, printable
from attncli.io import session

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
# Parsing text builds a Python object per number, so text files are read up to these sizes (each
# parses in under 6 s at its limit: libyaml 5.5 s, json 4.9 s, loadtxt 2.6 s, on a loaded 2-core
# machine); larger arrays belong in .npy (memory-mapped) files.
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
    """Bytes an array read into memory may take: the machine's free physical memory now, or the
    process's address-space limit (``ulimit -v``) where that is lower (a declared size above it is
    refused before anything is allocated or decompressed)."""
    try:
        free = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        free = 1 << 40
    try:
        import resource

        cap = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError):
        return free
    return free if cap == resource.RLIM_INFINITY or cap <= 0 else min(free, cap)


NPZ_MEMBER_ENV = "ATTNCLI_NPZ_MEMBER_MAX"  # bytes one .npz member may inflate to: 4G, 512M, 100000, ...
NPZ_MEMBER_DEFAULT = 4 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def npz_member_limit() -> tuple[int, str]:
    """Bytes one .npz member may inflate to (its .npy header included), and where that came from: the environment
    variable ATTNCLI_NPZ_MEMBER_MAX (a number of bytes, or with K, M, G, T: binary units), else 4 GiB. The free
    memory bounds it further (:func:`memory_limit`)."""
    text = os.environ.get(NPZ_MEMBER_ENV)
    if text is None or not text.strip():
        return NPZ_MEMBER_DEFAULT, f"4 GiB by default; {NPZ_MEMBER_ENV} sets it"
    m = re.fullmatch(r"\s*([0-9]{1,15})\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if m is None or int(m.group(1)) == 0:
        raise InputError(f"is {printable(text, 40)!r}; expected a size in bytes above 0, e.g. 4G, 512M or 1000000",
                         NPZ_MEMBER_ENV)
    size = int(m.group(1)) * _UNITS[m.group(2).upper()]
    return size, f"{NPZ_MEMBER_ENV}={printable(text.strip(), 40)}"


MAX_DIMS = 32  # numpy's limit before 2.0 and the most any attention input needs
MAX_ELEMENTS = 1 << 62
HEADER_BYTES = 1 << 16  # more than numpy reads of an .npy header (10,000 bytes)


def read_npy_header(f: IO[bytes], source: str, what: str = ".npy file") -> tuple[tuple[int, ...], bool, Any]:
    """(shape, fortran order, dtype) of the .npy header at ``f``, each checked: a shape of plain
    non-negative integers (not ``True``, not 10**20), at most MAX_DIMS of them, no objects."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    except Exception as e:  # numpy parses the header with tokenize/ast: ValueError, SyntaxError, TokenError...
        raise InputError(f"is not a valid {what} ({_one_line(e)[:120]})", source) from None
    if not all(type(x) is int and x >= 0 for x in shape):
        raise InputError(f"is not a valid {what}: its header's shape {printable(repr(shape), 80)} is not a tuple of "
                         "whole numbers >= 0", source)
    if len(shape) > MAX_DIMS:
        raise InputError(f"has {len(shape)} dimensions; at most {MAX_DIMS} are read", source)
    if math.prod(x for x in shape if x) > MAX_ELEMENTS // max(dtype.itemsize, 1):
        raise InputError(f"declares shape {printable(repr(tuple(shape)), 80)}, more elements than any machine holds",
                         source)
    if dtype.hasobject:
        raise InputError("holds an object array that needs pickle to load; pickles are never loaded "
                         "(save a numeric array instead)", source)
    return tuple(shape), bool(fortran), dtype


def check_npy_header(f: IO[bytes], available: int, source: str, what: str = ".npy file",
                     memory: int | None = None) -> int:
    """Read an .npy header from ``f`` and check that the data it declares fits in the
    ``available`` bytes after it (and in ``memory`` bytes, for data that will be decompressed
    into memory): a truncated file or one declaring an enormous shape fails here, fast,
    instead of allocating. Leaves ``f`` after the header; returns the bytes of data declared."""
    start = f.tell()
    shape, _, dtype = read_npy_header(f, source, what)
    count = math.prod(shape)
    need, have = count * dtype.itemsize, available - (f.tell() - start)
    if need > have:
        raise InputError(f"is truncated or corrupt: its header declares shape {shape} {dtype} "
                         f"({_size(need)}) but only {_size(max(have, 0))} of data follow", source)
    if memory is not None and need > memory:
        raise InputError(f"declares shape {shape} ({_size(need)}), more than this machine's free memory "
                         f"({_size(memory)}) allows; save it as an .npy file, which is memory-mapped", source)
    return need


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} bytes"


@loader(".npy")
def load_npy(data: bytes, source: str) -> np.ndarray:
    """An .npy file's bytes as an array, over those bytes (no copy: stdin's buffer becomes the array)."""
    f = io.BytesIO(bytes(data[:HEADER_BYTES]))  # the header only: the data is not copied
    check_npy_header(f, len(data), source)
    try:
        f.seek(0)
        shape, fortran, dtype = read_npy_header(f, source)
        return np.ndarray(shape, dtype=dtype, buffer=data, offset=f.tell(), order="F" if fortran else "C")
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
        with open_regular(path, source) as f:
            check_npy_header(f, size, source)
        session.watch_mapped(source)  # truncated while mapped: one line, exit 2, not a bare SIGBUS
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except InputError:
        raise
    except OSError as e:
        raise InputError(f"cannot be read ({e.strerror or _one_line(e)})", source) from None
    except ValueError as e:
        raise InputError(f"is not a valid .npy file ({_one_line(e)})", source) from None


@loader(".npz")
def load_npz(data: bytes, source: str) -> dict[str, Any]:
    return read_npz(io.BytesIO(data), source)


@file_loader(".npz")
def open_npz(path: Path, source: str) -> dict[str, Any]:
    """An .npz file read from disk as it is inflated (never whole in memory)."""
    try:
        size, limit = path.stat().st_size, memory_limit() // 2
        if size > limit:  # its arrays hold at least as much, stored: refused from the size alone
            raise InputError(f"is {_size(size)}, more than half the free memory; save large arrays as .npy", source)
        with open_regular(path, source) as f:
            return read_npz(f, source)
    except OSError as e:
        raise InputError(f"cannot be read ({e.strerror or _one_line(e)})", source) from None


NPZ_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, KeyError, NotImplementedError,
              RuntimeError, zlib.error, struct.error)


def read_npz(f: IO[bytes], source: str) -> dict[str, Any]:
    """The arrays of an .npz archive, by name. Each member's header is checked before any of its
    data is inflated: the declared shapes must fit the member's size and, all together, the free
    memory; then each is read in chunks into its array (numpy's read_array), so inflating never
    holds more than the arrays declared. Two members of one name are refused, naming it."""
    try:
        with zipfile.ZipFile(f) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir()]
            names = [i.filename[:-4] if i.filename.endswith(".npy") else i.filename for i in infos]
            seen: set[str] = set()
            for name in names:
                if name in seen:
                    raise InputError(f"holds two arrays named {printable(name, 60)!r}; each name may appear once", source)
                seen.add(name)
            total, free = 0, memory_limit()
            cap, said = npz_member_limit()
            for info, name in zip(infos, names):  # the sizes the archive declares, before any member is inflated
                if info.file_size > cap:
                    raise InputError(f"holds a member {printable(name, 60)!r} that inflates to {info.file_size:,} "
                                     f"bytes, more than the {cap:,} bytes ({said}) a member may; save large arrays "
                                     "as .npy, which are memory-mapped", source)
            for info, name in zip(infos, names):
                with zf.open(info) as member:
                    total += check_npy_header(member, info.file_size, f"{source}[{name}]", "array", memory=free)
                if total > free:  # e.g. many members that share one compressed stream
                    raise InputError(f"holds arrays of {_size(total)} in all, more than this machine's free memory "
                                     f"({_size(free)})", source)
            out: dict[str, Any] = {}
            for info, name in zip(infos, names):
                with zf.open(info) as member:
                    out[name] = np.lib.format.read_array(member, allow_pickle=False)
            return out
    except InputError:
        raise
    except NPZ_ERRORS as e:
        if "pickle" in str(e):
            raise InputError("holds an object array that needs pickle to load; pickles are never loaded",
                             source) from None
        raise InputError(f"is not a valid .npz file ({_one_line(e)[:120]})", source) from None


class _Refused(Exception):
    """A document the loader refuses for a reason of ours (a duplicate key), said by load_yaml."""


@loader(".yaml", ".yml")
def load_yaml(data: bytes, source: str) -> Content:
    import yaml

    check_text_bytes(data, source, MAX_YAML_BYTES, "YAML")
    text = _text(data, source)
    try:
        if _yaml_depth(text) > MAX_YAML_NESTING:  # before composing, which recurses (in C) on nesting
            raise InputError("is nested too deeply to read", source)
        doc = yaml.load(text, Loader=_yaml_loader())
    except InputError:
        raise
    except _Refused as e:
        raise InputError(str(e), source) from None
    except yaml.constructor.ConstructorError as e:
        tag = getattr(e, "problem", "") or ""
        raise InputError(f"holds a YAML tag that is not plain data ({_one_line(tag)[:80]}); only plain data is read",
                         source) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or _one_line(e)
        raise InputError(f"is not valid YAML{where}: {_one_line(problem)[:120]}", source) from None
    except RecursionError:
        raise InputError("is nested too deeply to read", source) from None
    except (ValueError, OverflowError) as e:  # e.g. an integer of more than 4300 digits
        raise InputError(f"holds a value that cannot be read ({_one_line(e)[:120]})", source) from None
    if doc is None:
        raise InputError("is empty: expected an array or a mapping with q, k, v", source)
    check_text_size(doc, source, what="YAML")
    return doc


MAX_NESTING = 1000  # brackets deep: far beyond any array (at most MAX_DIMS), well within every parser's stack
# YAML's own depth limit is ours, below libyaml's (1000 since PyYAML 6.0.4): our check, and our words, come first.
MAX_YAML_NESTING = 256


def _yaml_depth(text: str) -> int:
    """How deeply ``text`` nests sequences and mappings (stopping past MAX_NESTING), from libyaml's
    event stream: its parser keeps an explicit stack, where the composer that builds the
    document recurses in C and crashes (SIGSEGV) on ``- - - ... 1`` 100,000 deep. About a
    third of the time of the load itself."""
    import yaml

    loader = _yaml_loader()
    if not getattr(loader, "C_PARSER", False):
        return 0  # the pure-Python composer raises RecursionError, which load_yaml says
    codes = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    brackets = np.cumsum((codes == 0x5B).astype(np.int64) + (codes == 0x7B) - (codes == 0x5D) - (codes == 0x7D))
    if brackets.size and int(brackets.max()) > MAX_YAML_NESTING:  # flow style: libyaml's scanner reads ahead of events
        return int(brackets.max())
    opens, closes = (yaml.SequenceStartEvent, yaml.MappingStartEvent), (yaml.SequenceEndEvent, yaml.MappingEndEvent)
    depth = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, opens):
            depth += 1
            if depth > MAX_YAML_NESTING:
                return depth
        elif isinstance(event, closes):
            depth -= 1
    return 0


def _big_int(digits: str) -> int | float:
    """A whole number as written; beyond int64 (an array could not hold it) as the float it is."""
    v = int(digits)
    if -(1 << 63) <= v < 1 << 63:
        return v
    try:
        return float(v)
    except OverflowError:
        raise _Refused(f"holds numbers too large for a float (one of {len(digits.lstrip('+-'))} digits)") from None


_YAML_LOADER: Any = None
MERGE_TAG = "tag:yaml.org,2002:merge"
UNDERSCORED = "tag:attncli,2024:underscored-number"  # resolved only to be refused, with its line


def _yaml_loader() -> Any:
    """A safe YAML loader with the YAML 1.2 core schema: ``010`` is 10 (not 8), ``1:20`` and
    ``yes``/``no``/``on``/``off`` are text (not 80 and booleans), ``1e3`` and ``.5`` are numbers;
    only true/false are booleans, only null/~/empty is null. A key twice in one mapping is
    refused, naming it. Built once, on first use (yaml is imported lazily).

    libyaml's ``CSafeLoader`` where it is installed (4 MiB in about 4 s, not 30-50 s): its composer
    recurses on nesting in C, so load_yaml measures the nesting first (_yaml_depth)."""
    global _YAML_LOADER
    if _YAML_LOADER is None:
        import re

        import yaml

        base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

        class Loader(base):  # type: ignore[misc,valid-type]
            yaml_implicit_resolvers: dict[Any, Any] = {}  # the YAML 1.1 ones are not inherited
            C_PARSER = base is not yaml.SafeLoader

            def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
                if not isinstance(node, yaml.MappingNode):
                    raise yaml.constructor.ConstructorError(None, None, f"expected a mapping, found {node.id}",
                                                            node.start_mark)
                mapping: dict[Any, Any] = {}
                for key_node, value_node in node.value:
                    line = key_node.start_mark.line + 1
                    if key_node.tag == MERGE_TAG or (key_node.value == "<<" and not key_node.style):  # plain: None or ""
                        raise _Refused(f"uses a YAML merge key (<<) at line {line}, which YAML 1.2 does not have; "
                                       "write the keys out")
                    key = self.construct_object(key_node, deep=deep)
                    try:
                        hash(key)
                    except TypeError:
                        raise _Refused(f"has a key that is a list or mapping at line {line}; keys are names") from None
                    if key in mapping:
                        raise _Refused(f"has the key {printable(str(key), 60)!r} twice (again at line {line}); "
                                       "each key may appear once")
                    mapping[key] = self.construct_object(value_node, deep=deep)
                return mapping

        def resolver(tag: str, pattern: str, first: str) -> None:
            Loader.add_implicit_resolver(f"tag:yaml.org,2002:{tag}", re.compile(pattern), list(first))

        resolver("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF")
        resolver("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789")
        resolver("float", r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                          r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", "-+0123456789.")
        Loader.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"),
                                     ["~", "n", "N", ""])
        # 1_000 or 3.141_5: numbers in YAML 1.1, text in YAML 1.2; neither reading is safe to guess
        Loader.add_implicit_resolver(UNDERSCORED, re.compile(r"^[-+]?(?:[0-9][0-9_]*_[0-9_]*(?:\.[0-9_]*)?"
                                                             r"|[0-9]*\.[0-9_]*_[0-9_]*)(?:[eE][-+]?[0-9]+)?$"),
                                     list("-+0123456789."))

        def scalar(fn: Callable[[str], Any]) -> Callable[[Any, Any], Any]:
            return lambda loader, node: fn(loader.construct_scalar(node))

        def as_int(v: str) -> int | float:
            if v[:2] in ("0o", "0x"):
                return int(v[2:], 8 if v[1] == "o" else 16)
            return _big_int(v)

        def as_float(v: str) -> float:
            low = v.lower()
            if low.endswith(".inf"):
                return -math.inf if low.startswith("-") else math.inf
            return math.nan if low == ".nan" else float(v)

        def underscored(loader: Any, node: Any) -> Any:
            text = printable(str(node.value), 40)
            raise _Refused(f"holds {text} at line {node.start_mark.line + 1}: a number with underscores is a number in "
                           f"YAML 1.1 and text in YAML 1.2; write it without them ({text.replace('_', '')}), or quote it")

        Loader.add_constructor(UNDERSCORED, underscored)
        Loader.add_constructor("tag:yaml.org,2002:bool", scalar(lambda v: v.lower() == "true"))
        Loader.add_constructor("tag:yaml.org,2002:int", scalar(as_int))
        Loader.add_constructor("tag:yaml.org,2002:float", scalar(as_float))
        _YAML_LOADER = Loader
    return _YAML_LOADER


def check_text_size(doc: Any, source: str, limit: int = MAX_TEXT_ITEMS, what: str = "YAML") -> None:
    """Refuse a YAML/JSON document that expands to more than ``limit`` values. YAML aliases
    share one object, so a small file can stand for 10**9 numbers ("billion laughs"); the
    count is memoised by object, so this check itself stays linear in the containers."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(doc, False)]
    while stack:
        node, done = stack.pop()
        if not isinstance(node, (list, dict)) or (id(node) in sizes and not done):
            continue
        children = list(node.values()) if isinstance(node, dict) else node
        nested = [c for c in children if isinstance(c, (list, dict))]
        if not done:
            sizes[id(node)] = 0  # placeholder: a node that contains itself counts once
            stack.append((node, True))
            stack.extend((c, False) for c in nested)
            continue
        total = len(children) + sum(sizes.get(id(c), 0) for c in nested)
        sizes[id(node)] = total
        if total > limit:
            said = "expands to more than {:,} values (YAML aliases?)" if what == "YAML" else "holds more than {:,} values"
            raise InputError(f"{said.format(limit)}; save large arrays as .npy instead", source)


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Refused(f"has the member {printable(k, 60)!r} twice in one object; each name may appear once")
        out[k] = v
    return out


@loader(".json")
def load_json(data: bytes, source: str) -> Content:
    check_text_bytes(data, source, MAX_TEXT_BYTES, "JSON")
    if b'"' not in data and data.count(b",") >= MAX_TEXT_ITEMS:  # numbers only: each comma follows a value
        raise InputError(f"holds more than {MAX_TEXT_ITEMS:,} values; save large arrays as .npy instead", source)
    text = _text(data, source)
    try:
        doc = json.loads(text, object_pairs_hook=_json_pairs, parse_int=_big_int)
    except _Refused as e:
        raise InputError(str(e), source) from None
    except json.JSONDecodeError as e:
        raise InputError(f"is not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}", source) from None
    except RecursionError:
        raise InputError("is nested too deeply to read", source) from None
    except (ValueError, OverflowError) as e:  # e.g. an integer of more than 4300 digits
        raise InputError(f"holds a value that cannot be read ({_one_line(e)[:120]})", source) from None
    check_text_size(doc, source, what="JSON")
    return doc


@loader(".csv", ".txt", ".tsv")
def load_csv(data: bytes, source: str) -> np.ndarray:
    """Rows of numbers separated by commas, tabs or spaces; ``#`` starts a comment. numpy's
    loadtxt parses (in C: 64 MiB in seconds); a table it refuses is re-read row by row for a
    message that names the row and the cell."""
    check_text_bytes(data, source, MAX_TEXT_BYTES, "CSV")
    text = _text(data, source)
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), None)
    if first is None:
        raise InputError("is empty: expected rows of numbers", source)
    delim = "," if "," in first else "\t" if "\t" in first else None
    try:
        with np.errstate(all="ignore"):
            return np.loadtxt(io.StringIO(text), dtype=np.float64, delimiter=delim, comments="#", ndmin=2)
    except ValueError:
        pass
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    rows = []
    for i, ln in enumerate(lines, 1):
        cells = [c.strip() for c in (ln.split(delim) if delim else ln.split())]
        try:
            rows.append([float(c) for c in cells])
        except ValueError:
            bad = next(c for c in cells if not _is_float(c))
            raise InputError(f"row {i} holds {printable(bad, 40)!r}, which is not a number", source) from None
    widths = {len(r) for r in rows}
    if len(widths) > 1:
        raise InputError(f"is ragged: rows have {sorted(widths)[:8]} columns", source)
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
    from attncli.core.backend import TORCH_HINT, torch_available

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
    from attncli.core.backend import host_array

    try:
        if str(t.layout) != "torch.strided":  # sparse COO/CSR...
            t = t.to_dense()
        if t.is_quantized:
            t = t.dequantize()
        return host_array(t)
    except Exception as e:  # meta, nested or other tensors that have no numbers on the host
        raise InputError(f"tensor {name!r} cannot be read as numbers ({_one_line(e)[:120]})", source) from None


def sniff(data: bytes) -> str:
    """The extension whose loader fits bytes read from stdin (its first bytes are enough)."""
    if data.startswith(b"\x93NUMPY"):
        return ".npy"
    if data.startswith(b"PK"):  # a zip: torch.save's first member is <archive>/data.pkl, an .npz's NAME.npy
        n = int.from_bytes(bytes(data[26:28]), "little")
        return ".pt" if bytes(data[30:30 + n]).endswith(b"data.pkl") else ".npz"
    lines = (ln.strip() for ln in bytes(data[:SNIFF_BYTES]).lstrip(b"\xef\xbb\xbf").split(b"\n"))
    first = next((ln for ln in lines if ln and not ln.startswith(b"#")), b"")  # comments: CSV or YAML alike
    if first[:1] in (b"[", b"{"):
        return ".json"
    try:
        float(first.replace(b",", b" ").split()[0])
        return ".csv"
    except (ValueError, IndexError):
        return ".yaml"


# ---- reading --------------------------------------------------------------------------

def read_bounded(stream: IO[bytes], limit: int, source: str = "<stdin>", chunk: int = 1 << 20,
                 head: bytes = b"") -> bytearray:
    """``head`` and the rest of ``stream``, or a one-line InputError once it passes ``limit``
    bytes (so that ``cat /dev/zero | attncli run -`` stops instead of filling the memory). One
    growing buffer: a refused input costs about its limit, not a multiple of it."""
    buf = bytearray(head)
    while True:
        part = stream.read(min(chunk, limit + 1 - len(buf)) if len(buf) <= limit else 1)
        if not part:
            return buf
        buf += part
        if len(buf) > limit:
            raise InputError(f"{'sent' if source == '<stdin>' else 'holds'} more than {_size(limit)}; save large "
                             "arrays to an .npy file and give its name instead", source)


SNIFF_BYTES = 64 << 10  # read from stdin before its format is known, to know its limit


def stdin_limit(head: bytes, ext: str, source: str = "<stdin>") -> int:
    """The most bytes stdin may send in the format its first bytes show: the text limits, an .npy
    header's declared size (refused at once when it does not fit the free memory), half the free
    memory for an .npz."""
    if ext in TEXT_LIMITS:
        return TEXT_LIMITS[ext][0]
    free = memory_limit()
    if ext == ".npy":
        f = io.BytesIO(head)
        need = check_npy_header(f, 1 << 62, source, memory=free // 2)
        return f.tell() + need
    return free // 2


def read_stdin(stream: IO[bytes]) -> tuple[bytearray, str]:
    """All of stdin and the extension of its format, sniffed from its first bytes before the rest
    is buffered, and bounded by that format's limit."""
    head = stream.read(SNIFF_BYTES) or b""
    ext = sniff(head)
    limit = stdin_limit(head, ext)
    if ext == ".npy":  # its header and the data it declares; what follows is ignored, as in a file
        return read_exactly(stream, limit, head), ext
    what = TEXT_LIMITS.get(ext, (0, ext.lstrip(".") + " data"))[1]
    try:
        data = read_bounded(stream, limit, head=head)
    except InputError:
        raise InputError(f"sent more than {_size(limit)} of {what}; {what} on stdin is read up to that size "
                         "(save large arrays as .npy and give the file name)", "<stdin>") from None
    return data, ext


def read_exactly(stream: IO[bytes], size: int, head: bytes = b"", chunk: int = 1 << 20) -> bytearray:
    """The first ``size`` bytes of ``head`` + ``stream`` (fewer if it ends first), in one buffer of that size."""
    buf = bytearray(head[:size])
    while len(buf) < size:
        part = stream.read(min(chunk, size - len(buf)))
        if not part:
            break
        buf += part
    return buf


SMALL_ARRAY_BYTES = 1 << 20  # a vector with one number per head (--sinks, --alibi-slopes): far more than any needs


def open_regular(path: Path, source: str) -> IO[bytes]:
    """``path`` opened for reading if it is a regular file, without ever blocking: opened with
    O_NONBLOCK (a FIFO swapped in after a stat cannot hold the open), then checked with fstat."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(f"is {_kind(mode)}, not a regular file", source)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _kind(mode: int) -> str:
    import stat

    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device (e.g. /dev/zero: it never ends)" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")


def read_pipe(path: Path, ext: str, source: str, cap: int | None = None) -> tuple[bytearray, str]:
    """All of a FIFO or pipe (``<(cat q.pt)``, a named pipe) read once, in memory: opened without blocking
    (no writer: nothing to read, said at once), its format from the name or else sniffed from its first
    bytes, and bounded by that format's limit (and ``cap``)."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise InputError(f"is {_kind(os.fstat(fd).st_mode)}, not a file or a pipe", source)
        os.set_blocking(fd, True)  # a writer that is there (a process substitution) is waited for; none: EOF
        head = f.read(SNIFF_BYTES) or b""
        if not head:
            return bytearray(), ext
        if cap is not None and len(head) > cap:
            raise InputError(f"holds more than {_size(cap)}; this input is one number per head", source)
        ext = ext if ext in LOADERS else sniff(head)
        limit = stdin_limit(head, ext, source)
        if cap is not None and limit > cap:
            try:
                return read_bounded(f, cap, source, head=head), ext
            except InputError:
                raise InputError(f"holds more than {_size(cap)}; this input is one number per head", source) from None
        if ext == ".npy":
            return read_exactly(f, limit, head), ext
        return read_bounded(f, max(limit, 1), source, head=head), ext


def bundled_hint(path: Path) -> str:
    """'; cat_milk_sweet is a bundled example: attncli examples run cat_milk_sweet' when a missing file is
    named like one of the examples that ship with the package (a README command run outside the clone)."""
    from importlib import resources  # here: only on this error

    stem = path.name.rsplit(".", 1)[0] if "." in path.name else path.name
    try:
        names = {p.name.rsplit(".", 1)[0] for p in (resources.files("attncli") / "examples").iterdir()}
    except OSError:
        return ""
    return f"; {stem} is a bundled example: attncli examples run {stem}" if stem in names else ""


class Reader:
    """Reads files (and stdin, at most once: later reads of ``-`` reuse it), caching contents.
    Every file read is recorded in attncli.io.session, so that no output of the run replaces it."""

    def __init__(self, stdin: IO[bytes] | None = None) -> None:
        self._stdin = stdin
        self._cache: dict[str, Content] = {}
        self.paths: list[str] = []  # the files read so far (not stdin)
        self.raw: dict[str, bytes | bytearray] = {}  # the bytes of each input read whole (not memory-mapped), by spec
        self.formats: dict[str, str] = {}  # the extension each input was read as (stdin: sniffed)

    def read(self, spec: str, cap: int | None = None) -> Content:
        """The content of ``spec``; ``cap``: the most bytes it may hold (small vectors: SMALL_ARRAY_BYTES)."""
        if spec not in self._cache:
            self._cache[spec] = self._read(spec, cap)
        return self._cache[spec]

    def _read(self, spec: str, cap: int | None = None) -> Content:
        if spec == STDIN:
            stream = self._stdin or getattr(sys.stdin, "buffer", None)
            if stream is None:  # the shell closed it: `attncli run - <&-`
                raise InputError("is closed: nothing to read", "<stdin>")
            session.record_read_fd(stream)  # `attncli run - --save q.npy < q.npy` must not replace it
            try:
                data, ext = read_stdin(stream)
            except OSError as e:
                raise InputError(f"cannot be read ({e.strerror or _one_line(e)})", "<stdin>") from None
            if not data.strip():
                raise InputError("is empty: nothing was piped in", "<stdin>")
            self.formats[spec] = ext
            if ext in TEXT_LIMITS:
                self.raw[spec] = data
            return LOADERS[ext](data, "<stdin>")  # type: ignore[arg-type]
        import stat

        path = Path(spec)
        self.paths.append(spec)  # every file read, so that outputs never overwrite one of them
        session.record_read(path)
        ext = path.suffix.lower()
        self.formats[spec] = ext
        try:
            mode: int | None = os.stat(path).st_mode  # no open yet: a FIFO or a device is known before it can block
        except FileNotFoundError:
            mode = None
        except OSError as e:
            raise InputError(f"cannot be read ({e.strerror or _one_line(e)})", spec) from None
        if ext not in LOADERS and not (mode is not None and stat.S_ISFIFO(mode)):  # a pipe's format is sniffed
            raise InputError(f"has an unknown extension {printable(ext, 40) or '(none)'!r}; "
                             f"expected one of {', '.join(sorted(LOADERS))} or - for stdin", spec)
        if mode is None:
            raise InputError("no such file" + bundled_hint(path), spec)
        if stat.S_ISDIR(mode):
            raise InputError("is a directory, not a file", spec)
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):  # /dev/zero, /dev/urandom, a terminal, a socket
            raise InputError(f"is {_kind(mode)}, not a file or a pipe", spec)
        size = os.stat(path).st_size if stat.S_ISREG(mode) else 0
        if cap is not None and size > cap:
            raise InputError(f"is {_size(size)}; this input is one number per head, at most {_size(cap)}", spec)
        if stat.S_ISREG(mode) and ext in FILE_LOADERS:
            return FILE_LOADERS[ext](path, spec)
        try:
            if stat.S_ISFIFO(mode):  # a FIFO or `<(cat q.pt)`: read once, in memory, bounded by its format's limit
                data, ext = read_pipe(path, ext, spec, cap)
                self.formats[spec] = ext
            else:
                limit, what = TEXT_LIMITS.get(ext, (memory_limit() // 2, ""))
                if what:
                    check_text_bytes(b"", spec, limit, what, size)  # checked before reading: refused unread
                elif size > limit:
                    raise InputError(f"is {_size(size)}, more than half the free memory; save large arrays as .npy",
                                     spec)
                with open_regular(path, spec) as f:  # bounded too: the file may grow while it is read
                    data = read_bounded(f, max(min(limit, cap or limit), 1), spec)
        except OSError as e:
            raise InputError(f"cannot be read ({e.strerror or _one_line(e)})", spec) from None
        if not data.strip():
            raise InputError("is empty" + (" (a pipe with nothing written to it)" if stat.S_ISFIFO(mode) else ""), spec)
        if ext in TEXT_LIMITS:  # check re-reads the numbers as written (binary data is not kept twice)
            self.raw[spec] = data
        return LOADERS[ext](data, spec)  # type: ignore[arg-type]

    def source(self, spec: str) -> str:
        return "<stdin>" if spec == STDIN else spec

    def array(self, spec: str, name: str, fallbacks: tuple[str, ...] = (), cap: int | None = None) -> Any:
        """The array for slot ``name`` (q, k, v, mask, ...) from ``spec``: the file's one array,
        or, when the file is a mapping, its entry ``name`` (else the first of ``fallbacks``)."""
        content = self.read(spec, cap)
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

NAME_MAX = 255  # bytes in one file name on Linux, macOS and Windows file systems
TEMP_SUFFIX_BYTES = 16  # what mkstemp adds to a prefix: 8 random characters, ".tmp" and dots


@contextmanager
def atomic_write(path: str | os.PathLike[str], protect: Iterable[str] = ()) -> Iterator[IO[bytes]]:
    """Write ``path`` through a temporary file in the same folder, renamed into place only
    when the block succeeds (inside a command: when the whole command succeeds, with every other
    output; attncli.io.session.commit): an error, Ctrl-C or a terminating signal leaves no partial
    file (attncli.io.session removes the temporary). Refuses to write over any file this run has read
    (attncli.io.session records every one; ``protect`` adds more), and a file that another output
    of the run names. A file replaced keeps its permissions."""
    target = Path(path)
    name = str(path)
    base = os.fsencode(target.name)
    if len(base) > NAME_MAX:  # before any stat: the system refuses the name itself (ENAMETOOLONG)
        raise InputError(f"cannot be written: its name is {len(base)} bytes, longer than the {NAME_MAX} a file "
                         "name may have", name)
    for p in protect:
        if p != STDIN:
            session.record_read(p)
    session.claim_output(target, name)
    folder = target.parent if str(target.parent) else Path(".")
    try:
        if target.is_dir():
            raise InputError("is a directory; give a file name to save to", name)
        if not folder.is_dir():
            what = "is not a folder" if folder.exists() else "does not exist"
            raise InputError(f"cannot be written: folder {printable(str(folder))!r} {what}", name)
    except InputError:
        raise
    except (OSError, ValueError) as e:  # a folder name too long (ENAMETOOLONG), a NUL byte
        why = e.strerror if isinstance(e, OSError) and e.strerror else "its name holds a NUL byte"
        raise InputError(f"cannot be written ({why})", name) from None
    prefix = f".{target.name}." if len(base) + 1 + TEMP_SUFFIX_BYTES <= NAME_MAX else ".attncli."
    try:
        mode = target.stat().st_mode & 0o7777 if target.exists() else None
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    except OSError as e:  # a read-only or full folder: the user's to fix, not an internal error
        raise InputError(f"cannot be written ({e.strerror or _one_line(e)})", name) from None
    session.add_temp(tmp)
    try:
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask  # as open() would create it, not mkstemp's 0600
        os.chmod(tmp, mode)  # a replaced file keeps its mode (a 0600 secret stays 0600)
        with os.fdopen(fd, "wb") as f:
            yield f
        if session.defer(tmp, str(target)):  # renamed when the command succeeds: all its outputs, or none
            return
        with session.blocked():  # a signal now would find the file renamed and the temporary gone
            os.replace(tmp, target)
            session.drop_temp(tmp)
    except OSError as e:  # e.g. no space left on device, a file size limit
        _discard(tmp)
        raise InputError(f"cannot be written ({e.strerror or _one_line(e)})", name) from None
    except BaseException:
        _discard(tmp)
        raise


def _discard(tmp: str) -> None:
    Path(tmp).unlink(missing_ok=True)
    session.drop_temp(tmp)
