"""Array backends: numpy (default, CPU) and torch (CPU, CUDA, MPS), behind the array API.

The engine only ever calls ``xp.*`` on the namespace returned here; every backend quirk
lives in this module. torch is imported only when it is asked for.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
else:
    from attncli.lazy import numpy as np  # imported on first use: `attncli --help` needs none

from attncli.errors import BackendError

BACKENDS = ("numpy", "torch")
DEVICES = ("cpu", "cuda", "mps", "auto")
DTYPES = ("float32", "float64")  # computation; float16/bfloat16 inputs are computed in float32
PRECISIONS = ("bfloat16", "float16", "float32", "float64")  # what `check --precision-of` judges against

TORCH_HINT = "install it with: pip install 'attncli[torch]' (or pip install torch)"


@dataclass(frozen=True)
class Backend:
    """An array namespace plus the device arrays live on."""

    name: str
    xp: Any
    device: Any = None
    hold: Callable[[Any], Any] | None = None  # how a float array is held (attncli.check.precision: rounded), or as is

    def asarray(self, a: Any, dtype: str) -> Any:
        """Move a numpy array (or array-like) onto this backend with the given float dtype (``hold`` says how a
        float array is held, where the backend holds them in a precision of its own)."""
        if self.hold is not None and np.dtype(dtype).kind == "f":
            return self.hold(a)
        if self.name == "numpy":
            return np.asarray(a, dtype=dtype)
        import torch

        arr = np.ascontiguousarray(np.asarray(a, dtype=dtype))
        if not arr.flags.writeable:  # a memory-mapped .npy: torch wants memory it may write
            arr = arr.copy()
        return torch.from_numpy(arr).to(self.device)

    def asbool(self, a: Any) -> Any:
        if self.name == "numpy":
            return np.asarray(a, dtype=bool)
        import torch

        arr = np.ascontiguousarray(np.asarray(a, dtype=bool))
        return torch.from_numpy(arr if arr.flags.writeable else arr.copy()).to(self.device)  # a Problem's: read-only

    def device_name(self) -> str:
        return "cpu" if self.device is None else str(self.device)

    def cast(self, a: Any, half: str) -> Any:
        """``a`` rounded to a half type: float16 as such; bfloat16 as float32 holding bfloat16 values
        (numpy has no bfloat16, and the Trace hands out numpy arrays)."""
        if half == "float16":
            return self.xp.astype(a, self.xp.float16)
        if self.name == "numpy":
            return round_bfloat16(np.asarray(a, dtype=np.float32))
        import torch

        return a.to(torch.bfloat16).to(torch.float32)


@functools.cache
def bfloat16_values() -> type:
    """BFloat16Values: a float32 array whose values are bfloat16 numbers (from a .pt file or a
    torch tensor), the mark that makes the engine compute in float32 and round the output back
    to bfloat16. Made on first use, as numpy is (a subclass of np.ndarray)."""
    return type("BFloat16Values", (np.ndarray,), {"__doc__": bfloat16_values.__doc__, "__module__": __name__})


def round_bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), kept as float32."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


HALF_TYPES = {"float16": "float16", "torch.float16": "float16", "torch.bfloat16": "bfloat16"}


def half_type(a: Any) -> str | None:
    """'float16' or 'bfloat16' for an array (numpy, torch, or marked) in a half type, else None."""
    if isinstance(a, bfloat16_values()):
        return "bfloat16"
    dt = getattr(a, "dtype", None)
    if isinstance(dt, np.dtype):
        return "float16" if dt == np.float16 else None
    return None if dt is None else HALF_TYPES.get(str(dt))


def host_array(a: Any) -> Any:
    """A torch tensor as a numpy array (bfloat16 as :class:`BFloat16Values`); anything else as it is."""
    if not hasattr(a, "detach"):
        return a
    t = a.detach().cpu()
    if str(t.dtype) == "torch.bfloat16":
        return t.float().numpy().view(bfloat16_values())
    return t.numpy()


def to_numpy(a: Any) -> np.ndarray:
    """Any backend array as a numpy array on the host."""
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "detach"):  # torch.Tensor, without importing torch
        return a.detach().cpu().numpy()
    return np.asarray(a)


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def _import_torch(why: str) -> Any:
    if not torch_available():
        raise BackendError(f"{why} needs PyTorch, which is not installed; {TORCH_HINT}")
    import torch

    if _threads is not None:
        torch.set_num_threads(_threads)
    return torch


# ---- threads ---------------------------------------------------------------------------
# By default the libraries follow the usual variables (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
# MKL_NUM_THREADS), read when they load. --threads N changes the count at run time: torch
# through torch.set_num_threads, numpy's OpenBLAS through its own openblas_set_num_threads.

_threads: int | None = None
MAX_THREADS_PER_CORE = 4  # more threads than this only contend (torch segfaults at 10**6)
BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                "openblas_set_num_threads64_", "openblas_set_num_threads")


def set_threads(n: int) -> list[str]:
    """Use ``n`` threads in numpy's BLAS and in torch (now, or when it is imported).

    Returns the libraries that took the setting (empty where none could be found, e.g. a
    BLAS without a run-time setter: set OPENBLAS_NUM_THREADS / OMP_NUM_THREADS instead).
    """
    global _threads
    import os

    most = MAX_THREADS_PER_CORE * (os.cpu_count() or 1)
    if not 1 <= n <= most:
        raise BackendError(f"--threads must be 1 to {most} ({MAX_THREADS_PER_CORE}x the {os.cpu_count() or 1} cores "
                           f"here), got {str(n)[:20]}")
    _threads = n
    done = set_blas_threads(n)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
        done.append("torch")
    return done


def set_blas_threads(n: int) -> list[str]:
    """Set numpy's BLAS to ``n`` threads; the libraries that took it."""
    return [Path(p).name for p in blas_libraries() if _call(p, BLAS_SETTERS, n)]


def threads() -> int:
    """The CPU threads a run may use: --threads, else what the BLAS was started with, else the cores."""
    import os

    return _threads or blas_threads() or os.cpu_count() or 1


def blas_threads() -> int | None:
    """The thread count numpy's OpenBLAS reports (None where it cannot be asked)."""
    for p in blas_libraries():
        got = _call(p, ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                        "openblas_get_num_threads64_", "openblas_get_num_threads"))
        if got is not None:
            return int(got)
    return None


@functools.lru_cache(maxsize=1)
def blas_libraries() -> tuple[str, ...]:
    """Paths of the BLAS libraries loaded with numpy (Linux: from /proc/self/maps, read once)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return ()
    paths = {line.split()[-1] for line in maps.splitlines() if "blas" in line.lower()}
    return tuple(sorted(p for p in paths if p.startswith("/") and Path(p).name.startswith("lib")))


def _call(path: str, names: tuple[str, ...], *args: int) -> int | None:
    """Call the first of ``names`` found in the library: a setter (``args``; returns 1) or a getter."""
    import ctypes

    fn = _symbol(path, names)
    if fn is None:
        return None
    fn.restype = None if args else ctypes.c_int
    got = fn(*(ctypes.c_int(a) for a in args))
    return 1 if args else int(got)


@functools.lru_cache(maxsize=16)
def _symbol(path: str, names: tuple[str, ...]) -> Any:
    import ctypes

    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    return next((getattr(lib, n) for n in names if hasattr(lib, n)), None)


def resolve_device(torch: Any, device: str) -> Any:
    """Turn ``cpu|cuda|mps|auto`` into a torch.device, or raise a one-line BackendError."""
    cuda = bool(torch.cuda.is_available())
    mps = _mps_available(torch)
    if device == "auto":
        device = "cuda" if cuda else "mps" if mps else "cpu"
    if device == "cuda" and not cuda:
        raise BackendError(
            "--device cuda was requested but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}{', a CPU-only build' if torch.version.cuda is None else ''}); "
            "use --device cpu or --device auto"
        )
    if device == "mps" and not mps:
        raise BackendError(
            "--device mps was requested but torch.backends.mps.is_available() is False; "
            "use --device cpu or --device auto"
        )
    return torch.device(device)


def get_backend(name: str | None = None, device: str = "cpu") -> Backend:
    """The backend for ``--backend`` and ``--device``.

    numpy runs on the CPU and is the default. A GPU device (``cuda``, ``mps``) implies
    torch. ``auto`` picks CUDA, then MPS (both through torch, when it is installed), then
    the CPU with the requested backend (numpy unless torch was named).
    """
    if name is not None and name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if device not in DEVICES:
        raise BackendError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device in ("cuda", "mps"):
        if name == "numpy":
            raise BackendError(f"--backend numpy runs on the CPU only; use --backend torch for --device {device}")
        name = "torch"
    elif device == "auto" and name is None and torch_available():
        import torch

        if torch.cuda.is_available() or _mps_available(torch):
            name = "torch"
    if name in (None, "numpy"):
        return Backend("numpy", numpy_namespace(), None)
    torch = _import_torch(f"--backend torch / --device {device}")
    import array_api_compat.torch as xtorch

    return Backend("torch", xtorch, resolve_device(torch, device))


@functools.lru_cache(maxsize=1)
def numpy_namespace() -> Any:
    """numpy 2.1 and later is itself an array-API namespace; older numpy goes through
    array-api-compat (whose wrapper touches every numpy submodule: ~0.1 s of start-up)."""
    if np.lib.NumpyVersion(np.__version__) >= "2.1.0":
        return np
    import array_api_compat.numpy as xnp

    return xnp


def _mps_available(torch: Any) -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())
