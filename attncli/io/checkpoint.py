"""Reading model checkpoints as they are saved, one tensor at a time (io layer).

    a ``.safetensors`` file            8-byte little-endian header length, a JSON header
                                       (dtype, shape, data_offsets per tensor), raw data
    ``model.safetensors.index.json``   a sharded checkpoint: ``weight_map`` name -> shard file
    a ``save_pretrained`` folder       config.json + one of the above, or ``pytorch_model.bin``
    a ``.pt`` / ``.pth`` / ``.bin``    a PyTorch state dict (also nested under ``state_dict`` /
                                       ``model``), read with ``torch.load(weights_only=True, mmap=True)``

Opening a checkpoint reads headers only; :meth:`Checkpoint.tensor` reads one tensor (the
``safetensors`` package's ``safe_open(framework="numpy")``, or ``torch.load(mmap=True)``), so
reading one layer of a multi-GB file pages in that layer and nothing else. Tensors come back
in their stored dtype, read-only (bfloat16 and float8 through ``ml_dtypes``); the caller
converts to its compute dtype. Headers are checked strictly before the package sees them, so
that each lie has its own line naming the file and tensor: a header or offsets beyond the file,
overlapping tensors or gaps, an unknown dtype (or one that is not a string), a size that
disagrees with shape x dtype, a tensor named twice. Headers and indexes are parsed within
bounds (at most the package's 100,000,000 bytes, MAX_JSON_VALUES values counted before
parsing, MAX_DIGITS digits a number); only regular files are opened (O_NONBLOCK: a FIFO in a
model folder is said, never waited on); a checkpoint from a pipe (``<(cat model.pt)``) is read
once into memory, bounded, and never reopened.
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attncli.errors import InputError, printable
from attncli.io import session
from attncli.io.config import read_json_file
from attncli.io.files import _kind as file_kinds
from attncli.io.files import memory_limit, open_regular, read_bounded

# safetensors dtype -> (numpy dtype name or ml_dtypes name, item size in bytes)
DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U64": ("uint64", 8), "U32": ("uint32", 4), "U16": ("uint16", 2), "U8": ("uint8", 1), "BOOL": ("bool", 1),
}
ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")
FLOAT8 = ("float8_e4m3fn", "float8_e5m2")
MAX_HEADER = 100_000_000  # the safetensors package's own limit on a header (MAX_HEADER_SIZE in its source)
# JSON values ("{", "[" and "," counted before parsing) a header or an index may hold: a real header has
# about 9 per tensor (200,000 tensors fit); parsing a 99 MB header of "{}"s would take 2.6 GB, this takes
# about 300 MB at the limit.
MAX_JSON_VALUES = 2_000_000
MAX_DIGITS = 20  # an integer in a header or an index: 2**64 has 20 digits
MAX_INDEX = 64 << 20
CONFIG = "config.json"
# What a save_pretrained folder may hold, in the order they are looked for.
FOLDER_FILES = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json",
                "pytorch_model.bin")
TORCH_EXTS = (".pt", ".pth", ".bin")


def _one_line(e: object) -> str:
    return " ".join(str(e).split())[:160]


def numpy_dtype(name: str, source: str = "") -> np.dtype:
    """A numpy dtype by name; bfloat16 and float8 from ``ml_dtypes`` (imported only for them)."""
    if name in ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            raise InputError(f"holds {name} tensors; reading them needs ml_dtypes (pip install ml_dtypes)",
                             source or None) from None
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its shape and dtype, and its file (with the byte range for safetensors)."""
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy name: float32, float16, bfloat16, ...
    file: Path
    start: int = 0  # absolute byte offset in ``file`` (safetensors)
    stop: int = 0

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * numpy_dtype(self.dtype).itemsize


@dataclass
class Checkpoint:
    """Headers of every tensor of a checkpoint, the config beside it, and lazy reads."""
    source: str
    tensors: dict[str, TensorInfo]
    config: dict[str, Any] | None = None
    config_path: str | None = None
    files: list[Path] = field(default_factory=list)
    _torch: dict[Path, dict[str, Any]] = field(default_factory=dict, repr=False)
    _bytes: dict[Path, bytes | bytearray] = field(default_factory=dict, repr=False)  # a safetensors file read from a pipe

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def tensor(self, name: str) -> np.ndarray:
        """One tensor as a read-only numpy view of the mapped file, in its stored dtype."""
        info = self.tensors.get(name)
        if info is None:
            raise InputError(f"has no tensor {name!r}", self.source)
        if info.file in self._bytes:  # read once from a pipe: sliced from memory
            data = self._bytes[info.file]
            dt = numpy_dtype(info.dtype, str(info.file))
            a = np.frombuffer(data, dt, (info.stop - info.start) // dt.itemsize, info.start).reshape(info.shape)
            a.flags.writeable = False
            return a
        if info.file.suffix == ".safetensors":
            return self._safetensor(info)
        return self._torch_tensor(info)

    def _safetensor(self, info: TensorInfo) -> np.ndarray:
        dt = numpy_dtype(info.dtype, str(info.file))  # imports ml_dtypes for bfloat16, before safetensors needs it
        if info.stop > info.start:
            try:
                size = info.file.stat().st_size
            except OSError as e:
                raise InputError(f"cannot be read ({e.strerror or _one_line(e)})", str(info.file)) from None
            if info.stop > size:  # the file shrank since its header was read
                raise InputError(f"tensor {info.name!r} ends at byte {info.stop} but the file now holds {size}",
                                 str(info.file))
        session.record_read(info.file)  # a shard: no output of the run may replace it
        if info.dtype in FLOAT8:  # safetensors' numpy path has no float8 (numpy has no such dtype): the raw bytes
            a = np.fromfile(info.file, np.uint8, info.stop - info.start, offset=info.start).view(dt)
        else:
            session.watch_mapped(str(info.file))  # safetensors maps the file: truncated while read is SIGBUS
            with _safe_open(info.file) as f:  # closed (unmapped) after each tensor: only the copy stays resident
                a = f.get_tensor(info.name)
        a = a.reshape(info.shape)
        a.flags.writeable = False  # the checkpoint's numbers: never written into
        return a

    def _torch_tensor(self, info: TensorInfo) -> np.ndarray:
        sd = self._torch.get(info.file)
        if sd is None:
            sd = _torch_state_dict(info.file)[0]
            self._torch[info.file] = sd
        return _torch_numpy(sd[info.name], info.name, str(info.file))

    def nbytes(self, names: list[str] | None = None) -> int:
        return sum(self.tensors[n].nbytes for n in (names if names is not None else self.tensors))


# ---- safetensors -----------------------------------------------------------------------------

def read_safetensors_header(path: Path, data: bytes | bytearray | None = None) -> dict[str, TensorInfo]:
    """The tensors a .safetensors file declares, checked against the file's size; reads the header only.
    ``data``: the whole file, already read (from a pipe): checked the same way, and fully, here."""
    source = str(path)
    try:
        if data is not None:
            session.record_read(path)
            size, head = len(data), bytes(data[:8])
        else:
            f = open_regular(path, source)  # never blocks: a FIFO in a model folder is said, not waited on
            session.record_read_fd(f)  # the file itself (by inode: no path resolved again per shard)
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
        if len(head) < 8:
            raise InputError(f"is {size} bytes, too short for a safetensors header (8-byte length first)", source)
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise InputError(f"declares a header of {n} bytes but the file holds {size - 8} after the length "
                             "(truncated, or not a safetensors file)", source)
        if n > MAX_HEADER:
            raise InputError(f"declares a header of {n} bytes, more than the {MAX_HEADER} a safetensors header may "
                             "have", source)
        if data is not None:
            raw = bytes(data[8:8 + n])
        else:
            with f:
                raw = f.read(n)
    except OSError as e:
        raise InputError(f"cannot be read ({e.strerror or _one_line(e)})", source) from None
    header = parse_json(raw, source, "its header")
    if not isinstance(header, dict):
        raise InputError("has a header that is not a JSON object; not a safetensors file?", source)
    base, length = 8 + n, size - 8 - n
    out: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _entry(name, entry, path, base, length)
    spans = sorted((t.start, t.stop, t.name) for t in out.values() if t.stop > t.start)
    for (_, e0, a), (s1, _, b) in zip(spans, spans[1:]):
        if s1 < e0:
            raise InputError(f"tensors {a[:80]!r} and {b[:80]!r} overlap (bytes {s1 - base}.."
                             f"{e0 - base} of the data); the header is corrupt", source)
    # What the package checks too (it checks again when a tensor is read): the tensors tile the data, in order
    end = base
    for s0, e0, a in spans:
        if s0 != end:
            raise InputError(f"leaves bytes {end - base}..{s0 - base} of the data to no tensor (before "
                             f"{a[:80]!r}); the header is corrupt", source)
        end = e0
    if end != size:
        raise InputError(f"holds {size - end} bytes after its last tensor; the header is corrupt", source)
    return out


class _Refused(Exception):
    """A JSON document parse_json refuses for a reason of ours (said by parse_json, with its source)."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Refused(f"has the name {k[:80]!r} twice in one object", "each name may appear once")
        out[k] = v
    return out


def _int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_DIGITS:
        raise _Refused(f"holds a whole number of {len(digits.lstrip('-'))} digits",
                       f"sizes, offsets and counts have at most {MAX_DIGITS}")
    return int(digits)


def parse_json(raw: bytes, source: str, where: str) -> Any:
    """``raw`` (a safetensors header, an index) parsed within bounds: at most MAX_JSON_VALUES values (counted
    before parsing, so memory stays near the text's size), whole numbers of at most MAX_DIGITS digits, each
    name once per object (a tensor named twice is refused, not silently the last)."""
    values = raw.count(b",") + raw.count(b"{") + raw.count(b"[")
    if values > MAX_JSON_VALUES:
        raise InputError(f"has {values:,} JSON values in {where}, more than the {MAX_JSON_VALUES:,} any checkpoint "
                         "needs (about 9 per tensor); not a checkpoint?", source)
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_pairs, parse_int=_int)
    except _Refused as e:
        raise InputError(f"{e.args[0]} in {where}; {e.args[1]}", source) from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as e:
        raise InputError(f"has {where} that is not JSON ({_one_line(e)[:100]})", source) from None


def _safe_open(path: Path) -> Any:
    """``safetensors.safe_open(path, framework="numpy")``: it reads the header (checked above) and maps the file.
    Imported here: start-up never pays for it."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        raise InputError("is a safetensors file; reading it needs the safetensors package (pip install safetensors)",
                         str(path)) from None
    try:
        return safe_open(str(path), framework="numpy")
    except (SafetensorError, OSError) as e:
        raise InputError(f"is not a safetensors file the safetensors package reads ({_one_line(e)[:120]})",
                         str(path)) from None


def _entry(name: str, entry: Any, path: Path, base: int, data: int) -> TensorInfo:
    source = str(path)
    where = f"tensor {name[:120]!r}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise InputError(f"{where} has no dtype, shape and data_offsets in the header", source)
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        said = repr(dtype[:20]) if isinstance(dtype, str) else printable(json.dumps(dtype), 30)
        raise InputError(f"{where} has dtype {said}, which attncli does not know "
                         f"(known: {', '.join(DTYPES)})", source)
    if (not isinstance(shape, list) or len(shape) > 16
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 62 for s in shape)):
        raise InputError(f"{where} has shape {printable(json.dumps(shape), 60)}; expected a list of at most 16 "
                         "non-negative integers", source)
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise InputError(f"{where} has data_offsets {printable(json.dumps(offsets), 60)}; expected [begin, end]",
                         source)
    begin, end = offsets
    np_name, item = DTYPES[dtype]
    need = math.prod(shape) * item
    if not 0 <= begin <= end:
        raise InputError(f"{where} has data_offsets [{begin}, {end}]; expected 0 <= begin <= end", source)
    if end > data:
        raise InputError(f"{where} ends at byte {end} of the data but the file holds {data} bytes of data "
                         "(truncated, or the header lies)", source)
    if end - begin != need:
        raise InputError(f"{where} takes {end - begin} bytes but shape {tuple(shape)} {dtype} needs {need}", source)
    return TensorInfo(name, tuple(shape), np_name, path, base + begin, base + end)


# ---- PyTorch state dicts ---------------------------------------------------------------------

def _torch_state_dict(path: Path, data: bytes | bytearray | None = None) -> tuple[dict[str, Any], str]:
    """``torch.load(weights_only=True, mmap=True)``: the state dict (unnested) and where it was found.
    ``data``: the file already read (from a pipe), loaded from memory: a pipe cannot be opened twice."""
    from attncli.core.backend import TORCH_HINT, torch_available

    source = str(path)
    if not torch_available():
        raise InputError(f"is a PyTorch file, and reading it needs PyTorch; {TORCH_HINT}", source)
    import pickle
    import warnings

    import torch

    session.record_read(path)
    try:
        if data is not None:
            magic = bytes(data[:2])
        else:
            with open_regular(path, source) as f:
                magic = f.read(2)
    except OSError as e:
        raise InputError(f"cannot be read ({e.strerror or _one_line(e)})", source) from None
    if magic[:1] != b"\x80" and magic != b"PK":
        raise InputError("is not a PyTorch file (torch.save writes a zip archive)", source)
    obj: Any = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                if data is not None:
                    obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
                else:
                    obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:  # a legacy (non-zip) file cannot be memory-mapped
                if "mmap" not in str(e):
                    raise
                obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise InputError("holds Python objects beyond tensors (a pickled model?); only state dicts are read, "
                         "with weights_only=True: save model.state_dict() instead", source) from None
    except Exception as e:  # damaged bytes raise almost anything
        raise InputError(f"is not a PyTorch state dict that loads with weights_only=True ({_one_line(e)[:120]})",
                         source) from None
    where = ""
    args = obj.get("model_args") if isinstance(obj, dict) else None  # nanoGPT's ckpt.pt: n_head, n_embd, ...
    if isinstance(args, dict):
        _MODEL_ARGS[path] = {str(k): v for k, v in args.items() if isinstance(v, (int, float, bool, str))}
    for key in ("state_dict", "model", "model_state_dict", "module"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict) and not isinstance(obj.get(key), torch.Tensor):
            obj, where = obj[key], key
            break
    if not isinstance(obj, dict):
        raise InputError(f"holds a {type(obj).__name__}, not a state dict of tensors", source)
    sd = {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not sd:
        raise InputError("holds no tensors (expected a state dict, or one under 'state_dict' or 'model')", source)
    return sd, where


_MODEL_ARGS: dict[Path, dict[str, Any]] = {}  # a .pt file -> its model_args (nanoGPT), read beside the state dict


def model_args(files: list[Path]) -> dict[str, Any] | None:
    """The ``model_args`` a nanoGPT ``ckpt.pt`` saves beside its state dict (n_head, n_embd, ...), if any."""
    for f in files:
        if f in _MODEL_ARGS:
            return _MODEL_ARGS[f]
    return None


_TORCH_NAMES = {"float64": "float64", "float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
                "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2", "int64": "int64", "int32": "int32",
                "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool"}


def _torch_numpy(t: Any, name: str, source: str) -> np.ndarray:
    """A tensor as a numpy view (no copy where torch allows it; bfloat16/float8 viewed through ml_dtypes)."""
    import torch

    dname = str(t.dtype).removeprefix("torch.")
    if dname not in _TORCH_NAMES or t.layout != torch.strided or t.is_quantized:
        raise InputError(f"tensor {name!r} is {dname} ({t.layout}), which attncli cannot read as numbers", source)
    t = t.detach()
    if dname in ML_DTYPES:
        raw = t.view(torch.int16 if t.element_size() == 2 else torch.uint8).numpy()
        return raw.view(numpy_dtype(dname, source))
    return t.numpy()


def _torch_infos(path: Path, keep: dict[Path, dict[str, Any]], data: bytes | bytearray | None = None
                 ) -> dict[str, TensorInfo]:
    sd, _ = _torch_state_dict(path, data)  # memory-mapped: the tensors' bytes are not read here
    keep[path] = sd
    return {k: TensorInfo(k, tuple(int(s) for s in v.shape), _TORCH_NAMES.get(str(v.dtype).removeprefix("torch."),
                                                                               str(v.dtype).removeprefix("torch.")), path)
            for k, v in sd.items()}


# ---- opening ---------------------------------------------------------------------------------

def _read_json(path: Path, what: str, limit: int = MAX_INDEX) -> dict[str, Any]:
    """An index (or other JSON object beside the weights): read as config.json is (attncli.io.config)."""
    session.record_read(path)
    return read_json_file(path, what, limit)


def file_kind(path: Path) -> str | None:
    """None for a regular file (or a link to one); else what ``path`` is ("missing", "a FIFO", "a directory",
    "a device ..."), known from stat alone: nothing is opened."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing" if not os.path.islink(path) else "a broken link"
    except OSError as e:
        return f"unreadable ({e.strerror or _one_line(e)})"
    except ValueError:  # a NUL byte in the name
        return "unreadable (a file name holds a NUL byte)"
    return None if stat.S_ISREG(mode) else file_kinds(mode)


def _sharded(index: Path, keep: dict[Path, dict[str, Any]]) -> tuple[dict[str, TensorInfo], list[Path]]:
    doc = _read_json(index, "sharded checkpoint index")
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError("has no weight_map (name -> shard file); not a sharded checkpoint index", str(index))
    by_shard: dict[str, list[str]] = {}  # one pass: linear in the tensors, whatever the number of shards
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise InputError(f"maps tensor {name[:80]!r} to {printable(json.dumps(shard), 40)} in weight_map; "
                             "expected a shard's file name", str(index))
        by_shard.setdefault(shard, []).append(name)
    out: dict[str, TensorInfo] = {}
    files: list[Path] = []
    for shard in sorted(by_shard):
        names = by_shard[shard]
        if not shard or "\x00" in shard or Path(shard).name != shard or shard in (".", ".."):
            raise InputError(f"names shard {shard[:80]!r}, which is not a file name in its folder", str(index))
        p = index.parent / shard
        kind = file_kind(p)
        if kind is not None:
            others = " and others" if len(names) > 1 else ""
            what = kind if kind.startswith(("missing", "a broken", "unreadable")) else f"{kind}, not a file"
            raise InputError(f"names shard {shard[:80]!r} (for {names[0][:80]!r}{others}), which is {what}", str(index))
        infos = read_safetensors_header(p) if p.suffix == ".safetensors" else _torch_infos(p, keep)
        files.append(p)
        for name in names:
            if name not in infos:
                raise InputError(f"maps tensor {name[:80]!r} to {shard[:80]!r}, which does not hold it", str(index))
            out[name] = infos[name]
    return out, files


PIPE_FORMATS = "a PyTorch file (.pt) nor a .safetensors file"


def _from_pipe(path: Path, keep: dict[Path, dict[str, Any]], memory: dict[Path, bytes | bytearray]
               ) -> dict[str, TensorInfo]:
    """A checkpoint from a pipe (``<(cat model.pt)``): read once into memory, bounded by half the free memory,
    its format known from its first bytes; never reopened (a pipe cannot be read twice)."""
    source = str(path)
    limit = memory_limit() // 2
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            os.set_blocking(fd, True)  # a writer that is there is waited for; none: nothing to read
            head = f.read(1 << 16) or b""
            safetensors = len(head) > 8 and head[8:9] == b"{"  # (its length's first byte may be 0x80, as a pickle's)
            if not head:
                raise InputError("is an empty pipe; expected a PyTorch file (.pt) or a .safetensors file", source)
            if not safetensors and head[:2] != b"PK" and head[:1] != b"\x80":  # known before the rest is read
                raise InputError(f"is a pipe that holds neither {PIPE_FORMATS} (a sharded index is read from its "
                                 "folder)", source)
            try:
                data = read_bounded(f, limit, source, head=head)
            except InputError:
                raise InputError(f"sends more than {limit >> 20} MiB (half the memory free to it); give the checkpoint's "
                                 "file, which is read one tensor at a time", source) from None
    except OSError as e:
        raise InputError(f"cannot be read ({e.strerror or _one_line(e)})", source) from None
    session.record_read(path)
    if safetensors:
        infos = read_safetensors_header(path, data)
        memory[path] = data
        return infos
    return _torch_infos(path, keep, data)




def _weights_file(p: Path) -> bool:
    """``p`` is a regular file; absent: False; a FIFO, a directory or a device where weights belong: one line
    naming it (a folder's model.safetensors that is a FIFO would block the first open forever)."""
    kind = file_kind(p)
    if kind in (None, "missing"):
        return kind is None
    raise InputError(f"is {kind}, not a weights file", str(p))


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Headers of a checkpoint file or folder (and its config.json); no tensor data is read."""
    p = Path(path)
    source = str(path)
    kind = file_kind(p)  # stat alone; a name too long or holding a NUL byte is said here, naming it
    if kind is not None and kind.startswith("unreadable"):
        raise InputError(f"cannot be read ({kind.removeprefix('unreadable (').removesuffix(')')})", source)
    if not p.exists():
        raise InputError("no such file or folder", source)
    folder = p if p.is_dir() else p.parent
    target = p
    if p.is_dir():
        found = [folder / f for f in FOLDER_FILES if _weights_file(folder / f)]
        if not found:
            found = (sorted(q for q in folder.glob("*.safetensors") if _weights_file(q))
                     or sorted(q for e in (".pt", ".pth") for q in folder.glob("*" + e) if _weights_file(q)))
            if len(found) > 1:
                raise InputError(f"holds several weight files ({', '.join(q.name for q in found[:4])}) and no "
                                 "model.safetensors.index.json; give one file", source)
        if not found:
            raise InputError("is a folder without weights (expected model.safetensors, model.safetensors.index.json, "
                             "pytorch_model.bin or a .safetensors/.pt file)", source)
        target = found[0]
    name = target.name
    keep: dict[Path, dict[str, Any]] = {}
    memory: dict[Path, bytes | bytearray] = {}
    kind = file_kind(target)
    if kind == "a FIFO":  # `inspect <(cat model.pt)`: read once, into memory
        tensors, files = _from_pipe(target, keep, memory), [target]
    elif kind is not None:
        raise InputError(f"is {kind}, not a checkpoint file", source)
    elif name.endswith(".index.json"):
        tensors, files = _sharded(target, keep)
    elif target.suffix == ".safetensors":
        tensors, files = read_safetensors_header(target), [target]
    elif target.suffix in TORCH_EXTS:
        tensors, files = _torch_infos(target, keep), [target]
    else:
        raise InputError(f"is not a checkpoint (expected .safetensors, a *.index.json, .pt/.pth/.bin or a model "
                         f"folder; got {target.suffix or 'no extension'!r})", source)
    if not tensors:
        raise InputError("holds no tensors", str(target))
    config, config_path = None, None
    cfg = folder / CONFIG
    if os.path.lexists(cfg):  # a pipe, a folder or a device named config.json: one line, never a hang or a skip
        session.record_read(cfg)
        try:
            config, config_path = read_json_file(cfg, "model config"), str(cfg)
        except InputError:
            if p.is_dir() or not cfg.is_file():  # a model folder's own config must be readable
                raise
        if not p.is_dir() and config is not None and not {"model_type", "architectures"} & set(config):
            config, config_path = None, None  # some other program's config.json beside a weights file
        text = config.get("text_config") if config is not None else None  # multimodal (Gemma 3): the language model's
        if config is not None and isinstance(text, dict) and "num_attention_heads" not in config:
            config = {**text, "model_type": text.get("model_type", config.get("model_type")),
                      "architectures": config.get("architectures")}
    return Checkpoint(source, tensors, config, config_path, files, _torch=keep, _bytes=memory)
