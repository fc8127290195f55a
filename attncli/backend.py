"""Array backends: numpy (default, CPU) and torch (CPU, CUDA, MPS), behind the array API.

The engine only ever calls ``xp.*`` on the namespace returned here; every backend quirk
lives in this module. torch is imported only when it is asked for.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import numpy as np

from attncli.errors import BackendError

BACKENDS = ("numpy", "torch")
DEVICES = ("cpu", "cuda", "mps", "auto")
DTYPES = ("float32", "float64")

TORCH_HINT = "install it with: pip install 'attncli[torch]' (or pip install torch)"


@dataclass(frozen=True)
class Backend:
    """An array namespace plus the device arrays live on."""

    name: str
    xp: Any
    device: Any = None

    def asarray(self, a: Any, dtype: str) -> Any:
        """Move a numpy array (or array-like) onto this backend with the given float dtype."""
        if self.name == "numpy":
            return np.asarray(a, dtype=dtype)
        import torch

        t = torch.from_numpy(np.ascontiguousarray(np.asarray(a, dtype=dtype)))
        return t.to(self.device)

    def asbool(self, a: Any) -> Any:
        if self.name == "numpy":
            return np.asarray(a, dtype=bool)
        import torch

        return torch.from_numpy(np.ascontiguousarray(np.asarray(a, dtype=bool))).to(self.device)

    def device_name(self) -> str:
        return "cpu" if self.device is None else str(self.device)


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

    return torch


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
        import array_api_compat.numpy as xnp

        return Backend("numpy", xnp, None)
    torch = _import_torch(f"--backend torch / --device {device}")
    import array_api_compat.torch as xtorch

    return Backend("torch", xtorch, resolve_device(torch, device))


def _mps_available(torch: Any) -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())
