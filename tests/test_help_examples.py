"""Every example in every --help (issue 32, item 6): each one that can run from an empty folder with the bundled
examples is run here, as written, by bash (`attncli view` with --no-open, stopped once it serves); every other
one is listed in NOT_RUN with the reason. A new example that is in neither list fails the test."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from attncli.cli import app

ROOT = Path(__file__).resolve().parent.parent

NOT_RUN = {  # example -> why it cannot run from an empty folder with the bundled examples
    "attncli run q.npy k.npy v.npy --valid-lens 2,3 --format json": "needs the user's q.npy, k.npy, v.npy",
    "attncli run --score scaled-dot q.npy k.npy v.npy --valid-lens 2,3": "needs the user's q.npy, k.npy, v.npy",
    "attncli run q.yaml k.yaml v.yaml --format json | jq .output": "needs the user's YAML files (and jq)",
    "attncli self x.npy --weights mha.pt --heads 4 --format json": "needs the user's x.npy and a saved module",
    "attncli self x.npy --memory y.npy --heads 5 --seed 0 --save run.npz": "needs the user's x.npy and y.npy",
    "attncli view q.npy k.npy v.npy --causal": "needs the user's q.npy, k.npy, v.npy",
    "attncli view x.npy --weights MODEL_FOLDER --layer 3 --from-residual": "needs a model folder",
    "attncli view hidden.npz --weights MODEL_FOLDER --layer all --from-residual --no-open": "needs a model folder",
    "attncli check -e \"[[0.5, 0.5], [0.25, 0.75]]\" q.npy k.npy --what weights": "needs the user's q.npy, k.npy",
    "attncli check expected.npy q.npy k.npy v.npy --valid-lens 2,3 --format json": "needs the user's files",
    "attncli check kernel_out.pt q.pt k.pt v.pt --causal --precision-of bfloat16": "needs a kernel's saved tensors",
    "attncli check expected.npy q.npy k.npy v.npy -x 1,2": "needs the user's files",
    "attncli inspect ./tiny-llama": "needs a model folder",
    "attncli capture ./tiny-llama \"The cat drank the milk because it was sweet\" -o cap.npz": "needs a model folder "
    "(and its tokenizer)",
    "attncli self cap.npz --weights ./tiny-llama --layer 1": "needs a capture and its model folder",
    "attncli capture ./tiny-t5 \"the cat\" --target \"le chat\" -o t5.npz": "needs a model folder (and its tokenizer)",
    "attncli inspect model.safetensors --format json": "needs a checkpoint file",
    "attncli heads hidden.npy --weights ./tiny-llama": "needs a model folder and its hidden states",
    "attncli heads --induction 50 --weights ./tiny-llama --metric induction --top 5": "needs a model folder",
    "attncli heads --text-file corpus.txt --weights ./tiny-llama --format csv": "needs a model folder (and its "
    "tokenizer) and a corpus",
    "attncli heads shard1.npy --weights M --save a.json; attncli heads merge a.json b.json --save all.json":
    "needs a model folder and the shards' hidden states",
}


def help_examples() -> list[str]:
    """The example lines (after 'Examples:') of the help of every command and group, as written."""
    import typer.main

    found: list[str] = []

    def visit(cmd: object) -> None:
        text = getattr(cmd, "help", None) or ""
        if "Examples:" in text:
            for line in text.split("Examples:", 1)[1].splitlines():
                line = line.strip()
                if line.startswith("attncli") and line not in found:
                    found.append(line)
        for sub in getattr(cmd, "commands", {}).values():
            visit(sub)

    visit(typer.main.get_command(app))
    return found


EXAMPLES = help_examples()
RUN = [e for e in EXAMPLES if e not in NOT_RUN]


def test_every_example_is_run_or_listed_with_a_reason() -> None:
    assert len(EXAMPLES) >= 20, EXAMPLES  # the help texts were read
    assert not set(NOT_RUN) - set(EXAMPLES), f"listed but no longer in any --help: {set(NOT_RUN) - set(EXAMPLES)}"
    assert any(e.startswith("attncli examples show multihead_cat_milk | attncli view") for e in RUN)
    assert "attncli examples run cat_milk_sweet --explain it,milk --steps weights,output" in RUN


def _shell(tmp: Path) -> dict[str, str]:
    """An environment whose `attncli` is this checkout's (a wrapper script first on PATH)."""
    bin_dir = tmp.parent / f"{tmp.name}-bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "attncli"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m attncli \"$@\"\n")
    wrapper.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT),
            "COLUMNS": "100", "NO_COLOR": "1"}


@pytest.mark.skipif(sys.platform == "win32", reason="runs the examples with bash")
@pytest.mark.parametrize("example", RUN)
def test_example_runs_from_an_empty_folder(example: str, tmp_path: Path) -> None:
    env = _shell(tmp_path)
    if " attncli view " in f" {example} ":
        proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", example],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 120)  # the viewer says where it serves, once it does
            line = proc.stdout.readline() if ready else ""
            assert re.search(r"http://127\.0\.0\.1:\d+/\?token=", line), line
        finally:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C stops it
            proc.communicate(timeout=60)
        return
    r = subprocess.run(["bash", "-o", "pipefail", "-c", example], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, (example, r.stdout[-500:], r.stderr[-500:])
    assert "Traceback" not in r.stderr and "error" not in r.stderr, r.stderr
    if ">" in example:  # e.g. examples show NAME > mine.yaml: the file is written
        assert (tmp_path / example.rsplit(">", 1)[1].strip()).stat().st_size > 0
    else:
        assert r.stdout.strip(), example
