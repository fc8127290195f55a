"""The CUDA path, on a machine that has one: every path (explicit, blocked, SDPA, half precision,
the corner rows of a big view, the command line) on the GPU against numpy's float64 on the CPU.

Skipped where torch.cuda.is_available() is False, which is CI's case (device selection there
is tested with faked availability, in test_device.py). Run `pytest tests/test_gpu.py` on a
GPU machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attncli import attend
from attncli.cli import app

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

runner = CliRunner()
rng = np.random.default_rng(11)
Q, K, V = rng.standard_normal((2, 37, 16)), rng.standard_normal((2, 23, 16)), rng.standard_normal((2, 23, 8))
VALID = np.array([5, 23])

CASES = {
    "scaled-dot": {},
    "causal": {"causal": True},
    "valid-lens": {"valid_lens": VALID},
    "d2l-fill": {"valid_lens": VALID, "mask_value": -1e6},
    "additive": {"score": "additive", "hidden": 8, "seed": 0, "valid_lens": VALID},
    "cosine": {"score": "cosine", "temperature": 0.5},
}


@pytest.mark.parametrize("keep_weights", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_float64_equals_numpy(case: str, keep_weights: bool) -> None:
    """float64 on the GPU: the explicit path (every step) and the output-only paths, to 1e-10."""
    ref = attend(Q, K, V, dtype="float64", **CASES[case])
    got = attend(Q, K, V, dtype="float64", backend="torch", device="cuda", keep_weights=keep_weights, **CASES[case])
    assert got.meta.device.startswith("cuda")
    names = got.names() if keep_weights else ["output"]
    for name in names:
        np.testing.assert_allclose(got[name], ref[name], rtol=0, atol=1e-10, err_msg=name)
    assert got.warnings == ref.warnings


@pytest.mark.parametrize("case", ["scaled-dot", "causal", "valid-lens"])
def test_cuda_sdpa_float32(case: str) -> None:
    """float32 output only, dot-product scores: PyTorch's fused kernel on the GPU."""
    ref = attend(Q, K, V, dtype="float64", **CASES[case]).output
    got = attend(Q.astype(np.float32), K.astype(np.float32), V.astype(np.float32), backend="torch", device="cuda",
                 keep_weights=False, **CASES[case])
    assert got.meta.path == "sdpa"
    np.testing.assert_allclose(got.output, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_cuda_half_precision(half: torch.dtype) -> None:
    """Half inputs on the GPU: computed in float32, within 1e-2 relative of float64, no NaN."""
    q, k, v = (torch.from_numpy(a).to(half).cuda() for a in (Q, K, V))
    ref = attend(*(t.float().cpu().numpy().astype(np.float64) for t in (q, k, v))).output
    for keep in (True, False):
        got = attend(q, k, v, backend="torch", device="cuda", keep_weights=keep).output
        assert not np.isnan(got).any()
        np.testing.assert_allclose(np.asarray(got, dtype=np.float64), ref, rtol=1e-2, atol=1e-2)


def test_cuda_corner_rows() -> None:
    """The corners of a big view, computed on the GPU, are the full computation's rows."""
    from attncli.core.engine import run
    from attncli.core.plan import Needs, plan
    from attncli.core.problem import Options, Problem

    full = attend(Q, K, V, dtype="float64", causal=True)
    problem = Problem.build(Q, K, V, options=Options().merged(
        {"dtype": "float64", "causal": True, "backend": "torch", "device": "cuda"}, "test"))
    how = plan(problem, Needs(view_rows=lambda m: [0, 1, 35, 36], limit=4 * problem.n))
    assert how.rows == (0, 1, 35, 36)
    trace = run(problem, how)
    np.testing.assert_allclose(trace.weights, full.weights[..., [0, 1, 35, 36], :], rtol=0, atol=1e-10)


def test_cli_device_cuda(examples_dir: Path) -> None:
    res = runner.invoke(app, ["run", str(examples_dir / "cat_milk_sweet.yaml"), "--device", "cuda", "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["device"].startswith("cuda") and data["backend"] == "torch"
    np.testing.assert_allclose(data["output"][2], [0, 1.25, 2.75, 0], atol=1e-6)
