"""``attncli view`` without a browser: its tiles, cells and arithmetic against independent
references, and its security rules over real HTTP.

References: the weights computed here in float64 (a plain softmax), the PNG decoded by Pillow,
matplotlib's viridis; the arithmetic is compared with what ``attncli run --explain ... -f json``
prints for the same cell (the CLI's full trace, not the viewer's rows).
"""

from __future__ import annotations

import http.client
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app
from attncli.core.options import Options
from attncli.core.problem import Problem
from attncli.render import colours
from attncli.render.viewer import Layer, Server, Viewer, png

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
TOKEN = "t0ken-for-tests"


def softmax_causal(x: np.ndarray) -> np.ndarray:
    """Causal scaled-dot self-attention weights of x (..., T, d), float64."""
    x = x.astype(np.float64)
    s = x @ np.swapaxes(x, -1, -2) / np.sqrt(x.shape[-1])
    T = s.shape[-1]
    s = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, s)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[Server, np.ndarray]]:
    x = np.random.default_rng(0).standard_normal((1, 3, 40, 4))
    problem = Problem.build(x, options=Options().merged({"causal": True, "dtype": "float64"}, "test"))
    server = Server(Viewer([Layer(problem, "attention")], TOKEN), 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, x
    server.shutdown()
    server.server_close()


def get(server: Server, path: str, params: dict[str, Any] | None = None, host: str | None = None,
        method: str = "GET", token: str | None = TOKEN) -> tuple[int, bytes]:
    port = server.server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    q = dict(params or {})
    if token is not None:
        q["token"] = token
    conn.putrequest(method, f"{path}?{urlencode(q)}", skip_host=True)
    conn.putheader("Host", f"127.0.0.1:{port}" if host is None else host)
    conn.endheaders()
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r.status, body


def test_png_encoder_round_trips() -> None:
    from PIL import Image

    rgb = np.random.default_rng(1).integers(0, 256, (7, 5, 3), dtype=np.uint8)
    back = np.asarray(Image.open(io.BytesIO(png(rgb))).convert("RGB"))
    assert (back == rgb).all()


def test_a_tile_at_full_resolution_is_the_weights(served: tuple[Server, np.ndarray]) -> None:
    from PIL import Image

    server, x = served
    w = softmax_causal(x)[0, 1]  # head 1
    masked = np.triu(np.ones((40, 40), bool), 1)
    status, body = get(server, "/api/tile", {"layer": 0, "entry": "0,1", "step": "weights", "r0": 0, "r1": 40,
                                             "c0": 0, "c1": 40, "w": 40, "h": 40})
    assert status == 200
    got = np.asarray(Image.open(io.BytesIO(body)).convert("RGB")).astype(int)
    assert got.shape == (40, 40, 3)
    assert (got[masked] == colours.MASKED_RGB).all()
    kept = softmax_causal(x)[0][:, ~masked]  # every head shares the colour scale: its smallest value to
    lo, hi = kept.min(), np.percentile(kept, 99.5)  # the 99.5th percentile (40 x 40: the overview is every cell)
    from matplotlib import colormaps

    want = np.asarray(colormaps["viridis"](np.clip((w[~masked] - lo) / (hi - lo), 0, 1)))[:, :3] * 255
    assert np.abs(got[~masked] - want).max() <= 7  # 256 colours, 17 stops: within a few levels


def test_a_downsampled_tile_shows_the_largest_of_each_block(served: tuple[Server, np.ndarray]) -> None:
    from matplotlib import colormaps
    from PIL import Image

    server, x = served
    w = softmax_causal(x)[0]  # (3, 40, 40)
    masked = np.triu(np.ones((40, 40), bool), 1)
    status, body = get(server, "/api/tile", {"layer": 0, "entry": "0,0", "step": "weights", "r0": 0, "r1": 40,
                                             "c0": 0, "c1": 40, "w": 10, "h": 10})
    got = np.asarray(Image.open(io.BytesIO(body)).convert("RGB")).astype(int)
    assert status == 200 and got.shape == (10, 10, 3)
    lo, hi = w[:, ~masked].min(), np.percentile(w[:, ~masked], 99.5)  # the overview: every cell at this size
    blocks = np.where(masked, -np.inf, w[0]).reshape(10, 4, 10, 4).max(axis=(1, 3))  # 4 x 4 cells a pixel
    for a in range(10):
        for b in range(10):
            if b > a:  # every cell of the block masked
                assert tuple(got[a, b]) == colours.MASKED_RGB
            else:
                want = np.asarray(colormaps["viridis"](min(1.0, (blocks[a, b] - lo) / (hi - lo)))[:3]) * 255
                assert np.abs(got[a, b] - want).max() <= 7, (a, b)


def test_the_cells_of_a_region_are_exact(served: tuple[Server, np.ndarray]) -> None:
    server, x = served
    w = softmax_causal(x)[0, 2]
    status, body = get(server, "/api/cells", {"layer": 0, "entry": "0,2", "step": "weights", "r0": 5, "r1": 9,
                                              "c0": 0, "c1": 8})
    assert status == 200
    values = json.loads(body)["values"]
    for a, i in enumerate(range(5, 9)):
        for b in range(8):
            assert (values[a][b] is None) == (b > i)  # masked: None
            if b <= i:
                assert values[a][b] == pytest.approx(w[i, b], rel=1e-12)


def test_requests_without_the_token_with_a_foreign_host_or_for_a_path_are_refused(
        served: tuple[Server, np.ndarray]) -> None:
    server, _ = served
    port = server.server_address[1]
    assert get(server, "/api/meta")[0] == 200
    assert get(server, "/api/meta", host=f"localhost:{port}")[0] == 200
    assert get(server, "/api/meta", token=None)[0] == 403
    assert get(server, "/api/meta", token="wrong")[0] == 403
    assert get(server, "/", token=None)[0] == 403
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}", "127.0.0.1", ""):
        assert get(server, "/api/meta", host=host)[0] == 403, host
    for path in ("/etc/passwd", "/../../etc/passwd", "/api/file", "/static/x.js", "/favicon.ico"):
        assert get(server, path)[0] == 404, path
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert get(server, "/api/meta", method=method)[0] == 405
    assert get(server, "/api/tile", {"layer": 5})[0] == 400
    assert server.server_address[0] == "127.0.0.1"


def test_the_page_loads_nothing_from_the_network(served: tuple[Server, np.ndarray]) -> None:
    import re

    status, body = get(served[0], "/")
    text = body.decode()
    assert status == 200 and "<canvas" in text
    assert not re.search(r"(src|href)\s*=\s*[\"']?https?:|@import|<link", text)


def cli_explained(args: list[str], spec: str, row: bool = False) -> list[str]:
    r = runner.invoke(app, [*args, "-f", "json", "--explain-row" if row else "--explain", spec])
    assert r.exit_code == 0, r.output
    e = json.loads(r.stdout)["explanations"][0]
    return [e["heading"], *e["lines"]]


CASES = {
    "causal": (["--causal"], (1, 2, 9, 4)),
    "rope-alibi-softcap": (["--causal", "--rope", "half", "--alibi", "--softcap", "5"], (1, 2, 9, 4)),
    "window": (["--window", "3"], (1, 2, 9, 4)),
    "batch": (["--valid-lens", "5,7"], (2, 8, 3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cells_arithmetic_is_the_explain_text(tmp_path: Path, case: str) -> None:
    from attncli.cli.inputs import build_problem
    from attncli.cli.options import ProblemArgs
    from attncli.io.files import Reader

    flags, shape = CASES[case]
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(2).standard_normal(shape))
    args = ["run", str(x), *flags]
    # the viewer's problem, built as `attncli view` builds it
    parsed = {"causal": "--causal" in flags, "rope": "half" if "--rope" in flags else None,
              "alibi": True if "--alibi" in flags else None, "softcap": 5.0 if "--softcap" in flags else None,
              "window": 3 if "--window" in flags else None, "valid_lens": "5,7" if "--valid-lens" in flags else None}
    given = {k: v for k, v in parsed.items() if v not in (None, False)}
    valid_lens = given.pop("valid_lens", None)
    opts = ProblemArgs(valid_lens=valid_lens, options=given)
    layer = Layer(build_problem([str(x)], opts, Reader()), "attention")
    lead = layer.lead
    entry = tuple(n - 1 for n in lead)
    prefix = ",".join(map(str, entry)) + ":" if entry else ""
    for i, j in ((0, 0), (4, 2), (layer.m - 1, 1)):
        got = layer.explain(entry, i, j)
        assert [got["heading"], *got["lines"]] == cli_explained(args, f"{prefix}{i},{j}")
    got = layer.explain(entry, 5, None)
    assert [got["heading"], *got["lines"]] == cli_explained(args, f"{prefix}5", row=True)


def test_multihead_self_attention_cell_is_the_explain_text(tmp_path: Path) -> None:
    from attncli.cli.inputs import build_problem
    from attncli.cli.options import ProblemArgs
    from attncli.io.files import Reader

    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(5).standard_normal((6, 8)))
    opts = ProblemArgs(heads=4, options={"kv_heads": 2, "seed": 3, "causal": True})
    layer = Layer(build_problem([str(x)], opts, Reader(), multihead=True), "attention")
    args = ["self", str(x), "--heads", "4", "--kv-heads", "2", "--seed", "3", "--causal"]
    got = layer.explain((3,), 4, 2)
    assert [got["heading"], *got["lines"]] == cli_explained(args, "3:4,2")
    got = layer.explain((1,), 5, None)
    assert [got["heading"], *got["lines"]] == cli_explained(args, "1:5", row=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_view(args: list[str], cwd: Path) -> tuple[subprocess.Popen[str], str]:
    """`attncli view ARGS --no-open` as a process; its URL once printed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "attncli", "view", *args, "--no-open"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # even if the suite ignores it
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("attncli view: http://127.0.0.1:"), (line, proc.stderr.read() if proc.stderr else "")
    return proc, line.split(": ", 1)[1].strip()


def test_the_server_stops_on_sigint_and_leaves_nothing_behind(tmp_path: Path) -> None:
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal((12, 4)))
    port = free_port()
    before = sorted(p.name for p in tmp_path.iterdir())
    proc, url = start_view([str(x), "--port", str(port)], tmp_path)
    assert url.startswith(f"http://127.0.0.1:{port}/?token=")
    import urllib.request

    with urllib.request.urlopen(url.replace("/?", "/api/meta?"), timeout=30) as r:
        assert json.loads(r.read())["layers"][0]["m"] == 12
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert err.strip() == "attncli: viewer stopped"
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no file left behind
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):  # nothing listens there any more
        s.connect(("127.0.0.1", port))


def test_bad_view_options_are_one_line(tmp_path: Path) -> None:
    x = tmp_path / "x.npy"
    np.save(x, np.ones((3, 2)))
    r = runner.invoke(app, ["view", str(x), "--layer", "two", "--no-open"])
    assert r.exit_code == 2 and "--layer" in r.output and len(r.output.strip().splitlines()) == 1
    r = runner.invoke(app, ["view", str(x), "--layer", "all", "--no-open"])
    assert r.exit_code == 2 and "--weights" in r.output


@pytest.mark.parametrize(("shape", "fr", "fc"), [((2, 9, 13), 4, 4), ((3, 8, 12), 2, 3), ((5, 7), 1, 2), ((4, 6), 3, 1)])
def test_pool_is_the_largest_value_of_each_block(shape: tuple[int, ...], fr: int, fc: int) -> None:
    """The overview's max-pooling against a plain loop: NaN (masked) cells are ignored, a block of only NaN or
    -inf is NaN, a last partial block takes what it has."""
    from attncli.render.viewer import pool

    a = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    a[..., 0, :3] = np.nan
    a[..., 1:3, 2:6] = -np.inf
    a[..., :fr, :fc] = np.nan  # one block wholly hidden
    got = pool(a, fr, fc)
    m, n = shape[-2:]
    M, N = -(-m // fr), -(-n // fc)
    want = np.full(shape[:-2] + (M, N), np.nan, dtype=np.float32)
    for idx in np.ndindex(*shape[:-2]):
        for i in range(M):
            for j in range(N):
                cells = [float(x) for x in a[idx][i * fr:(i + 1) * fr, j * fc:(j + 1) * fc].ravel()
                         if not np.isnan(x) and x != -np.inf]
                if cells:
                    want[idx + (i, j)] = max(cells)
    np.testing.assert_array_equal(got, want)
