"""The CUDA path, on a machine that has one: every path (explicit, blocked, SDPA, half precision,
the corner rows of a big view, the command line) on the GPU against numpy's float64 on the CPU, and
against torch's own F.scaled_dot_product_attention run on the device (float32/float64 to rounding; half
precision by its error bound against float64, not its bits).

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


# ---- against torch's own SDPA on the device ----------------------------------------------------------------

DEVICE = "cuda"


def sdpa_on_device(case: str, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """torch's own F.scaled_dot_product_attention on the device, in ``dtype``, on the case's Q, K, V (the causal case
    on a square problem, Q = K = V, where top-left and bottom-right alignment are one) and the inputs it used."""
    import torch.nn.functional as F

    q, k, v = (torch.from_numpy(a).to(dtype).to(DEVICE) for a in ((Q, Q, Q) if case == "causal" else (Q, K, V)))
    if case == "causal":
        v = v[..., :8]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v
    mask = None
    if case == "valid-lens":  # keep key j of batch entry b where j < VALID[b] (d2l's valid lengths), every query
        mask = (torch.arange(K.shape[1], device=DEVICE)[None, :] < torch.from_numpy(VALID).to(DEVICE)[:, None])[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), q, k, v


def _ours(case: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> np.ndarray:
    opts = {"causal": True} if case == "causal" else {"valid_lens": VALID} if case == "valid-lens" else {}
    return np.asarray(attend(q, k, v, backend="torch", device=DEVICE, keep_weights=False, **opts, **kw).output,
                      dtype=np.float64)


@pytest.mark.parametrize("case", ["scaled-dot", "causal", "valid-lens"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_equals_torchs_own_sdpa_on_the_device(case: str, dtype: torch.dtype) -> None:
    """attncli's torch backend on the GPU against F.scaled_dot_product_attention run there by torch itself, on the
    same inputs: float64 to 1e-10, float32 to 1e-5 (two kernels' float32 sums)."""
    want, q, k, v = sdpa_on_device(case, dtype)
    got = _ours(case, q, k, v)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    np.testing.assert_allclose(got, want.double().cpu().numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("case", ["scaled-dot", "causal", "valid-lens"])
@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_cuda_half_is_as_near_the_truth_as_torchs_own_sdpa(case: str, half: torch.dtype) -> None:
    """Half inputs: attncli's output on the GPU is no farther from float64 (on the same rounded inputs) than torch's
    own SDPA in the same dtype on the device, within a factor 2 (the error bound, not the bits: the kernels differ),
    and within two of the dtype's units of SDPA's output (relative to the output's scale)."""
    want, q, k, v = sdpa_on_device(case, half)
    q64, k64, v64 = (t.double() for t in (q, k, v))  # the rounded inputs, exactly
    import torch.nn.functional as F

    mask = None
    if case == "valid-lens":
        mask = (torch.arange(K.shape[1], device=DEVICE)[None, :] < torch.from_numpy(VALID).to(DEVICE)[:, None])[:, None]
    exact_np = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=mask, is_causal=case == "causal").cpu().numpy()
    got = _ours(case, q, k, v)
    sdpa = want.double().cpu().numpy()
    assert not np.isnan(got).any()
    err_ours, err_sdpa = np.abs(got - exact_np).max(), np.abs(sdpa - exact_np).max()
    assert err_ours <= 2 * err_sdpa + 1e-6, (err_ours, err_sdpa)
    unit = torch.finfo(half).eps * float(np.abs(exact_np).max())
    assert np.abs(got - sdpa).max() <= 2 * unit + 2 * err_sdpa, (np.abs(got - sdpa).max(), unit)


# ---- attncli heads --device cuda ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float64", 1e-10)])
def test_heads_device_cuda_equals_the_models_own_weights_and_numpy(tmp_path: Path, dtype: str, tol: float) -> None:
    """`heads --device cuda` (projections and scores on the GPU, the sums on the host): the statistics of a tiny
    GQA Llama's own eager weights (transformers on the CPU, float32) by a plain loop, and the numpy path's to
    rounding."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    m.save_pretrained(tmp_path / "m")
    ids = torch.as_tensor(np.random.default_rng(0).integers(3, 50, size=(3, 12)))
    with torch.no_grad():
        out = m(ids, output_hidden_states=True, output_attentions=True)
    np.save(tmp_path / "h.npy", np.stack([h.numpy() for h in out.hidden_states]))
    a = np.stack([x.numpy() for x in out.attentions]).astype(np.float64)  # (layers, B, H, T, T)
    ref = {"first": a[..., 0].mean(axis=(1, 3)), "max": a.max(axis=-1).mean(axis=(1, 3))}
    docs = {}
    for device in ("cpu", "cuda"):
        res = runner.invoke(app, ["heads", str(tmp_path / "h.npy"), "-w", str(tmp_path / "m"), "--format", "json",
                                  "--dtype", dtype, "--device", device])
        assert res.exit_code == 0, res.output
        docs[device] = json.loads(res.stdout)
    for stat in ("first", "max", "entropy", "previous", "self", "distance"):
        got = {d: np.array([[r[stat]["mean"] for r in docs[d]["statistics"] if r["layer"] == L] for L in (0, 1)])
               for d in docs}
        np.testing.assert_allclose(got["cuda"], got["cpu"], rtol=0, atol=tol, err_msg=stat)
        if stat in ref:
            np.testing.assert_allclose(got["cuda"], ref[stat], rtol=0, atol=1e-5, err_msg=stat)
