"""Faults injected into real attncli processes (issue 17): stdout on a full disk, /dev/full,
closed or a pipe closed early; a file size limit (RLIMIT_FSIZE) while saving; terminating
signals at random moments, start-up included; a named pipe read by `check`; and the memory a
refused stdin costs. Each runs the console script in a subprocess (real descriptors, real
signals); the timeouts only guard against hangs."""

from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import attncli

BIN = Path(sys.executable).parent
ATTNCLI = shutil.which("attncli", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}") or "attncli"
ROOT = str(Path(attncli.__file__).parent.parent)
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1", "COLUMNS": "100",
       "PYTHONPATH": ROOT}
pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX descriptors, limits and signals")


def default_signals() -> None:
    """In the child: SIGINT and SIGHUP at their default action, whatever the suite inherited (tests/test_signals.py)."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)

X = np.array([[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], [0, 0, 4, 0]], dtype=np.float64)


def sh(cmd: str, cwd: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120, **kw)


def stderr_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 300 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


# ---- stdout ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["json", "npz", "rich"])
def test_stdout_on_dev_full_is_one_line_exit_2(tmp_path: Path, fmt: str) -> None:
    proc = sh(f"{ATTNCLI} examples run cat_milk_sweet --format {fmt} > /dev/full", tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert stderr_line(proc) == "attncli: error: stdout: cannot be written (No space left on device)"


@pytest.mark.parametrize("fmt", ["json", "rich"])
def test_closed_stdout_is_one_line_exit_2(tmp_path: Path, fmt: str) -> None:
    proc = sh(f"{ATTNCLI} examples run cat_milk_sweet --format {fmt} >&-", tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "stdout: cannot be written" in stderr_line(proc)


@pytest.mark.parametrize("cmd", ["examples run cat_milk_sweet", "examples run cat_milk_sweet --format json",
                                 "examples show cat_milk_sweet"])
def test_a_reader_closing_the_pipe_early_is_a_quiet_exit_0(tmp_path: Path, cmd: str) -> None:
    proc = sh(f"{ATTNCLI} {cmd} | head -c 1 > /dev/null; exit ${{PIPESTATUS[0]}}", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def limit_file_size(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_stdout_to_a_file_past_the_size_limit_is_exit_2_not_a_truncated_success(tmp_path: Path) -> None:
    """The issue's full disk (a 64 KiB out.json, exit 0): a file size limit makes the write fail
    halfway, as a full disk does."""
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(64, 64)))
    with open(tmp_path / "out.json", "wb") as out:
        proc = subprocess.run([ATTNCLI, "run", "x.npy", "--format", "json"], cwd=tmp_path, env=ENV, stdout=out,
                              stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=lambda: limit_file_size(20_000))
    assert proc.returncode == 2, proc.stderr
    assert "stdout: cannot be written (File too large)" in stderr_line(proc)  # type: ignore[arg-type]


def test_save_past_the_size_limit_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(64, 64)))
    (tmp_path / "out.npz").write_bytes(b"old")
    proc = subprocess.run([ATTNCLI, "run", "x.npy", "--save", "out.npz", "-q"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=120, preexec_fn=lambda: limit_file_size(20_000))
    assert proc.returncode == 2, proc.stderr
    assert stderr_line(proc) == "attncli: error: out.npz: cannot be written (File too large)"
    assert (tmp_path / "out.npz").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz", "x.npy"]


# ---- signals at random moments -------------------------------------------------------------------

# The console script, with the NPZ writer stopping halfway through the file (after a marker file
# says so) long enough for the test to send a signal.
SLOW_SAVE = r"""
import sys, time
from collections.abc import Iterator
from pathlib import Path
from attncli.__main__ import install
install()  # what the console script does first
from attncli.render import SAVERS, load_renderers
load_renderers()
marker = Path(sys.argv[1])
def slow(trace, opts, f):
    f.write(b"PK\x03\x04 half of a file")
    f.flush()
    marker.write_text("writing")
    time.sleep(60)
SAVERS[".npz"] = slow
from attncli.cli import main
sys.argv = ["attncli", "run", *sys.argv[2:]]
main()
"""

CODES = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated"), signal.SIGHUP: (129, "hung up")}


def python_starting(stderr: str) -> bool:
    """A SIGINT that lands while the interpreter itself starts (its site module, the path finders, the
    package's own near-empty __init__), before attncli.__main__ runs a line: Python's KeyboardInterrupt
    or 'Fatal Python error: init_import_site', which no program can prevent. Any frame of attncli's
    own code past that point (its handlers are the first thing __main__.main does) is not this."""
    if not ("Traceback" in stderr or "Fatal Python error" in stderr) or not stderr.rstrip().endswith("KeyboardInterrupt"):
        return False
    ours = [line for line in stderr.splitlines() if "/attncli/" in line and "attncli/__init__.py" not in line]
    return not ours


@pytest.mark.slow
def test_signals_at_random_moments(tmp_path: Path) -> None:
    """SIGINT, SIGTERM or SIGHUP at a random moment in the first 0.6 s (start-up, reading, writing):
    either the run finished first (exit 0, the file written) or it exits 128 + signal with one line
    (or, before Python has started at all, dies of the signal with nothing said), and in every
    case leaves no temporary and no output file."""
    rng = random.Random(17)
    outcomes = []
    for trial in range(24):
        sig = rng.choice(list(CODES))
        out = tmp_path / f"out{trial}.json"
        proc = subprocess.Popen([ATTNCLI, "examples", "run", "cat_milk_sweet", "--save", out.name, "--format", "json"],
                                cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=default_signals)
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
        code, said = CODES[sig]
        outcomes.append(proc.returncode)
        if python_starting(stderr):  # Python's own start-up (site, the package's import) had the signal
            assert not out.exists() and stdout == ""
            continue
        assert "Traceback" not in stderr, stderr
        if proc.returncode == 0:  # finished before the signal
            assert out.exists() and stdout.startswith("{")
        elif proc.returncode == -sig:  # the interpreter had not started: killed by the default action
            assert stderr == "" and not out.exists()
        else:
            assert proc.returncode == code, (sig, proc.returncode, stderr)
            assert stderr.strip() == f"attncli: error: {said}"
            assert not out.exists() and stdout == ""
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert set(outcomes) & {130, 143, 129}, outcomes  # some signals did land inside attncli


# ---- inputs read once ------------------------------------------------------------------------------

def test_check_reads_a_named_pipe_once(tmp_path: Path) -> None:
    fifo = tmp_path / "problem.yaml"
    os.mkfifo(fifo)
    text = (Path(attncli.__file__).parent / "examples" / "cat_milk_sweet.yaml").read_bytes()

    def write_once() -> None:
        with open(fifo, "wb") as f:
            f.write(text)

    writer = threading.Thread(target=write_once, daemon=True)
    writer.start()
    proc = subprocess.run([ATTNCLI, "check", str(fifo), "-q"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=60)
    writer.join(timeout=5)
    assert proc.returncode == 0, proc.stderr  # the example's published numbers match


# ---- memory of a refused stdin --------------------------------------------------------------------

def peak_rss(cmd: list[str], stdin_bytes: int, pattern: bytes, cwd: Path) -> tuple[int, int, float]:
    """(exit code, peak resident bytes of the child, seconds) for ``cmd`` fed ``stdin_bytes`` of ``pattern``."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    assert proc.stdin is not None
    chunk = pattern * ((1 << 20) // len(pattern))
    sent = 0
    try:
        while sent < stdin_bytes:
            proc.stdin.write(chunk)
            sent += len(chunk)
    except BrokenPipeError:
        pass
    try:
        proc.stdin.close()
    except BrokenPipeError:
        pass
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024, time.monotonic() - start


@pytest.mark.parametrize(("pattern", "limit"), [(b"0, ", 64 << 20), (b"\0", 4 << 20), (b"1,2\n", 64 << 20)],
                         ids=["json-like", "zeros-as-yaml", "csv"])
def test_a_refused_stdin_costs_less_than_twice_its_limit(tmp_path: Path, pattern: bytes, limit: int) -> None:
    """`head -c 3G /dev/zero | attncli check -e - x.npy` was OOM-killed; now stdin is sniffed by its
    first bytes and refused at its format's limit: the memory above a tiny refused run's stays
    under twice that limit."""
    np.save(tmp_path / "x.npy", X)
    base = peak_rss([ATTNCLI, "run", "-"], 1, b"\0", tmp_path)
    code, peak, _ = peak_rss([ATTNCLI, "run", "-"], limit + (8 << 20), b"[" + pattern if pattern == b"0, " else pattern,
                             tmp_path)
    assert base[0] == 2 and code == 2
    assert peak - base[1] < 2 * limit, (peak, base[1])


def test_sighup_while_saving_removes_the_temporary(tmp_path: Path) -> None:
    """SIGHUP (a closed terminal) halfway through writing the file: exit 129, one line, neither
    the file nor its temporary left (the issue found `.out.json.XXXX.tmp` left behind)."""
    np.save(tmp_path / "k.npy", X)
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SAVE,
                             str(marker), "k.npy", "--save", "out.npz", "-q"], cwd=tmp_path, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), proc.communicate()[1]  # the state: halfway through writing the file
        assert [p for p in tmp_path.iterdir() if p.name.startswith(".out.npz.")]  # the temporary exists now
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 129, err
    assert err.strip() == "attncli: error: hung up"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.npy", "marker"]


def test_closed_stdin_is_one_line(tmp_path: Path) -> None:
    proc = sh(f"{ATTNCLI} run - <&-", tmp_path)
    assert proc.returncode == 2
    assert stderr_line(proc) == "attncli: error: <stdin>: is closed: nothing to read"


def test_stdin_redirected_from_a_file_is_an_input_too(tmp_path: Path) -> None:
    np.save(tmp_path / "q.npy", X)
    before = (tmp_path / "q.npy").read_bytes()
    proc = sh(f"{ATTNCLI} run - --save q.npy -q < q.npy", tmp_path)
    assert proc.returncode == 2
    assert stderr_line(proc) == "attncli: error: q.npy: is one of the inputs; refusing to overwrite it"
    assert (tmp_path / "q.npy").read_bytes() == before


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (needs root; skipped elsewhere): a disk that really fills up."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_full_disk_while_saving_and_on_stdout(tmp_path: Path, small_disk: Path) -> None:
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(96, 96)))  # outputs of ~150 KiB and more
    proc = subprocess.run([ATTNCLI, "run", "x.npy", "--save", str(small_disk / "out.npz"), "-q"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert stderr_line(proc).endswith("out.npz: cannot be written (No space left on device)")
    assert list(small_disk.iterdir()) == []  # neither the file nor its temporary
    proc = sh(f"{ATTNCLI} run x.npy --format json > {small_disk / 'out.json'}", tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert stderr_line(proc) == "attncli: error: stdout: cannot be written (No space left on device)"
