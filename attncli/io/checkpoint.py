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
that each lie has its own line: a header or offsets beyond the file, overlapping tensors, an
unknown dtype or a size that disagrees with shape x dtype is a one-line :class:`InputError`
naming the file and tensor; what the package refuses beyond that (gaps, bytes after the last
tensor) is one line too.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attncli.errors import InputError
from attncli.io import session
from attncli.io.config import read_json_file

# safetensors dtype -> (numpy dtype name or ml_dtypes name, item size in bytes)
DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U64": ("uint64", 8), "U32": ("uint32", 4), "U16": ("uint16", 2), "U8": ("uint8", 1), "BOOL": ("bool", 1),
}
ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")
FLOAT8 = ("float8_e4m3fn", "float8_e5m2")
MAX_HEADER = 100 << 20  # the safetensors library's own limit on a header (100 MB)
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

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def tensor(self, name: str) -> np.ndarray:
        """One tensor as a read-only numpy view of the mapped file, in its stored dtype."""
        info = self.tensors.get(name)
        if info is None:
            raise InputError(f"has no tensor {name!r}", self.source)
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

def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors a .safetensors file declares, checked against the file's size; reads the header only."""
    source = str(path)
    session.record_read(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise InputError(f"is {size} bytes, too short for a safetensors header (8-byte length first)", source)
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise InputError(f"declares a header of {n} bytes but the file holds {size - 8} after the length "
                                 "(truncated, or not a safetensors file)", source)
            if n > MAX_HEADER:
                raise InputError(f"declares a header of {n} bytes, more than the {MAX_HEADER} a safetensors header may have",
                                 source)
            raw = f.read(n)
    except OSError as e:
        raise InputError(f"cannot be read ({e.strerror or _one_line(e)})", source) from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise InputError(f"has a header that is not JSON ({_one_line(e)[:100]}); not a safetensors file?", source) from None
    if not isinstance(header, dict):
        raise InputError("has a header that is not a JSON object; not a safetensors file?", source)
    base, data = 8 + n, size - 8 - n
    out: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _entry(name, entry, path, base, data)
    spans = sorted((t.start, t.stop, t.name) for t in out.values() if t.stop > t.start)
    for (_, e0, a), (s1, _, b) in zip(spans, spans[1:]):
        if s1 < e0:
            raise InputError(f"tensors {a!r} and {b!r} overlap (bytes {s1 - base}..{e0 - base} of the data); "
                             "the header is corrupt", source)
    with _safe_open(path):  # what the package refuses beyond the checks above (gaps, bytes after the last tensor)
        pass
    return out


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
    if dtype not in DTYPES:
        raise InputError(f"{where} has dtype {str(dtype)[:20]!r}, which attncli does not know "
                         f"(known: {', '.join(DTYPES)})", source)
    if (not isinstance(shape, list) or len(shape) > 16
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 62 for s in shape)):
        raise InputError(f"{where} has shape {str(shape)[:60]}; expected a list of non-negative integers", source)
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise InputError(f"{where} has data_offsets {str(offsets)[:60]}; expected [begin, end]", source)
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

def _torch_state_dict(path: Path) -> tuple[dict[str, Any], str]:
    """``torch.load(weights_only=True, mmap=True)``: the state dict (unnested) and where it was found."""
    from attncli.core.backend import TORCH_HINT, torch_available

    source = str(path)
    if not torch_available():
        raise InputError(f"is a PyTorch file, and reading it needs PyTorch; {TORCH_HINT}", source)
    import pickle
    import warnings

    import torch

    session.record_read(path)
    try:
        with open(path, "rb") as f:
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


def _torch_infos(path: Path, keep: dict[Path, dict[str, Any]]) -> dict[str, TensorInfo]:
    sd, _ = _torch_state_dict(path)  # memory-mapped: the tensors' bytes are not read here
    keep[path] = sd
    return {k: TensorInfo(k, tuple(int(s) for s in v.shape), _TORCH_NAMES.get(str(v.dtype).removeprefix("torch."),
                                                                               str(v.dtype).removeprefix("torch.")), path)
            for k, v in sd.items()}


# ---- opening ---------------------------------------------------------------------------------

def _read_json(path: Path, what: str, limit: int = MAX_INDEX) -> dict[str, Any]:
    session.record_read(path)
    try:
        if path.stat().st_size > limit:
            raise InputError(f"is larger than {limit >> 20} MiB; not a {what}?", str(path))
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"cannot be read ({e.strerror or _one_line(e)})", str(path)) from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise InputError(f"is not valid JSON ({_one_line(e)[:100]})", str(path)) from None
    if not isinstance(doc, dict):
        raise InputError(f"is not a JSON object; expected a {what}", str(path))
    return doc


def _sharded(index: Path, keep: dict[Path, dict[str, Any]]) -> tuple[dict[str, TensorInfo], list[Path]]:
    doc = _read_json(index, "sharded checkpoint index")
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError("has no weight_map (name -> shard file); not a sharded checkpoint index", str(index))
    shards = sorted({str(v) for v in weight_map.values()})
    out: dict[str, TensorInfo] = {}
    files: list[Path] = []
    for shard in shards:
        if Path(shard).name != shard:
            raise InputError(f"names shard {shard[:80]!r}, which is not a file name in its folder", str(index))
        p = index.parent / shard
        if not p.is_file():
            names = [k for k, v in weight_map.items() if v == shard]
            raise InputError(f"names shard {shard!r} (for {names[0]!r}{' and others' if len(names) > 1 else ''}), "
                             "which is missing", str(index))
        infos = read_safetensors_header(p) if p.suffix == ".safetensors" else _torch_infos(p, keep)
        files.append(p)
        for name, shard_of in weight_map.items():
            if shard_of == shard:
                if name not in infos:
                    raise InputError(f"maps tensor {name!r} to {shard!r}, which does not hold it", str(index))
                out[name] = infos[name]
    return out, files


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Headers of a checkpoint file or folder (and its config.json); no tensor data is read."""
    p = Path(path)
    source = str(path)
    if not p.exists():
        raise InputError("no such file or folder", source)
    folder = p if p.is_dir() else p.parent
    target = p
    if p.is_dir():
        found = [folder / f for f in FOLDER_FILES if (folder / f).is_file()]
        if not found:
            found = sorted(folder.glob("*.safetensors")) or sorted(q for e in (".pt", ".pth") for q in folder.glob("*" + e))
            if len(found) > 1:
                raise InputError(f"holds several weight files ({', '.join(q.name for q in found[:4])}) and no "
                                 "model.safetensors.index.json; give one file", source)
        if not found:
            raise InputError("is a folder without weights (expected model.safetensors, model.safetensors.index.json, "
                             "pytorch_model.bin or a .safetensors/.pt file)", source)
        target = found[0]
    name = target.name
    keep: dict[Path, dict[str, Any]] = {}
    if name.endswith(".index.json"):
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
    return Checkpoint(source, tensors, config, config_path, files, _torch=keep)
