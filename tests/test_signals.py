"""Files and processes: outputs are written atomically and never over an input; Ctrl-C
(SIGINT) exits 130 and leaves no partial file; stdin works in a shell pipeline; exit codes
are the documented table (0 success, 2 bad input or usage, 70 internal error, 130 interrupted).

These run the installed ``attncli`` console script in subprocesses (a real process, real
signals, a real pipe); the timeouts only guard against hangs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app
from attncli.io.files import atomic_write

BIN = Path(sys.executable).parent
ATTNCLI = shutil.which("attncli", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}") or "attncli"
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1", "COLUMNS": "100"}
runner = CliRunner()
posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX signals and shell")

# cat/milk/it/sweet (the seeds' self-attention example): milk's weights are softmax(4, 5, 4, 6)
X = np.array([[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], [0, 0, 4, 0]], dtype=np.float64)


def softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "q.yaml").write_text("q: " + json.dumps(X.tolist()) + "\n")
    np.save(tmp_path / "k.npy", X)
    np.save(tmp_path / "v.npy", X)
    return tmp_path


# ---- stdin in a pipeline -------------------------------------------------------------------

@posix_only
def test_stdin_pipeline(work: Path) -> None:
    """cat q.yaml | attncli run - k.npy v.npy --format json | python -c '...' (jq need not exist)."""
    reader = f"{sys.executable} -c 'import json, sys; print(json.load(sys.stdin)[\"output\"][1][2])'"
    proc = subprocess.run(f"cat q.yaml | {ATTNCLI} run - k.npy v.npy --format json | {reader}", shell=True,
                          cwd=work, env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    ref = softmax_rows(X @ X.T / 2.0) @ X  # by hand: d = 4, scale 1/sqrt(4)
    assert float(proc.stdout) == pytest.approx(ref[1, 2], rel=1e-12)  # milk, third feature: 3.4451...


@posix_only
def test_stdin_npy_bytes_and_npz_out_on_stdout(work: Path) -> None:
    """Binary in and out: an .npy piped in, an NPZ archive written to stdout and read back."""
    proc = subprocess.run([ATTNCLI, "run", "-", "--format", "npz"], input=(work / "k.npy").read_bytes(),
                          cwd=work, env=ENV, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (work / "out.npz").write_bytes(proc.stdout)
    with np.load(work / "out.npz") as z:
        np.testing.assert_allclose(z["weights"], softmax_rows(X @ X.T / 2.0), rtol=1e-12)


# ---- Ctrl-C -------------------------------------------------------------------------------

def wait_until_reading_a_pipe(pid: int, limit: float = 120.0) -> None:
    """Until the process sleeps reading its stdin pipe (Linux: /proc/PID/wchan names a pipe read, or
    /proc/PID/syscall shows read(0, ...) on x86-64), so the signal lands in attncli's read and not while
    Python is still importing it: the state itself, however slow a loaded machine makes start-up."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        try:
            if "pipe" in Path(f"/proc/{pid}/wchan").read_text() \
                    or Path(f"/proc/{pid}/syscall").read_text().startswith("0 0x0 "):
                return
        except OSError:
            pass
        time.sleep(0.02)
    pytest.fail(f"process {pid} was not seen reading its stdin pipe within {limit:.0f} s")


def default_signals() -> None:
    """In the child, before it runs: SIGINT and SIGHUP at their default action. A suite started where they are
    ignored (nohup, `pytest &` in a script, some CI runners) passes the ignoring on to every child, and attncli
    keeps an ignored signal ignored (as nohup asks): the tests of its handlers would wait for nothing."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@posix_only
def test_sigint_while_reading_stdin_exits_130_and_saves_nothing(work: Path) -> None:
    """Ctrl-C while attncli waits for piped input: exit 130, one line, no output file."""
    proc = subprocess.Popen([ATTNCLI, "run", "-", "--save", "out.npz"], cwd=work, env=ENV, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        wait_until_reading_a_pipe(proc.pid)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err or "Aborted" in err
    assert "Traceback" not in err
    assert not (work / "out.npz").exists()
    assert not [p for p in work.iterdir() if p.name.endswith(".tmp")]


# The real CLI, with the NPZ writer slowed down halfway through the file: the parent waits for
# the "writing" marker, sends SIGINT, and checks that neither the file nor its temporary remain.
SLOW_SAVE = r"""
import sys, time
from pathlib import Path
from attncli.__main__ import install
install()  # what the console script does first: the library and attncli.cli.main install no handler
from attncli.render import SAVERS, load_renderers
load_renderers()
real = SAVERS[".npz"]
marker = Path(sys.argv[1])
def slow(trace, opts, f):
    f.write(b"PK\x03\x04 half of a file")
    f.flush()
    marker.write_text("writing")
    time.sleep(60)
    real(trace, opts, f)
SAVERS[".npz"] = slow
from attncli.cli import main
sys.argv = ["attncli", "run", *sys.argv[2:]]
main()
"""


@posix_only
@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "terminated")])
def test_signal_while_saving_leaves_no_partial_file(work: Path, sig: int, code: int, said: str) -> None:
    """Ctrl-C (130) or kill/timeout's SIGTERM (143) halfway through writing the file: neither
    the file nor its temporary remain."""
    marker = work / "marker"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SAVE, str(marker), "k.npy", "--save", "out.npz", "-q"],
                            cwd=work, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), proc.communicate()[1]
        assert [p for p in work.iterdir() if p.name.startswith(".out.npz.")]  # the temporary exists now
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert err.strip() == f"attncli: error: {said}"
    assert not (work / "out.npz").exists()
    assert not [p for p in work.iterdir() if p.name.startswith(".out.npz.")]


def test_atomic_write_keeps_the_old_file_on_interrupt(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt), atomic_write(target) as f:
        f.write(b"new, partial")
        raise KeyboardInterrupt
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    with atomic_write(target) as f:
        f.write(b"new")
    assert target.read_text() == "new"


# ---- never over an input --------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["k.npy", "--save", "k.npy"],
    ["k.npy", "v.npy", "--save", "v.npy"],
    ["k.npy", "--save", "./sub/../k.npy"],
    ["k.npy", "--save", "link.npy"],  # a symlink to k.npy
    ["k.npy", "--save", "hard.npy"],  # a hard link to k.npy
    ["k.npy", "--mask", "mask.npy", "--save", "mask.npy"],
    ["k.npy", "--valid-lens", "lens.json", "--save", "lens.json"],
])
def test_never_saves_over_an_input(work: Path, args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(work)
    (work / "sub").mkdir()
    np.save(work / "mask.npy", np.ones((4, 4), dtype=bool))
    (work / "lens.json").write_text("[4, 4, 4, 4]")
    (work / "link.npy").symlink_to(work / "k.npy")
    os.link(work / "k.npy", work / "hard.npy")
    before = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()}
    res = runner.invoke(app, ["run", *args])
    assert res.exit_code == 2, res.stderr
    assert "is one of the inputs; refusing to overwrite it" in res.stderr
    assert {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()} == before


# ---- exit codes: the documented table --------------------------------------------------------

EXIT_CODES = [
    # (arguments, exit code, what stderr says)
    (["run", "k.npy", "--format", "json"], 0, ""),
    (["run", "missing.npy"], 2, "no such file"),
    (["run", "k.npy", "--score", "nonsense"], 2, "nonsense"),
    (["run", "k.npy", "--no-such-option"], 2, "No such option"),
    (["run"], 2, "Missing argument"),
    (["run", "k.npy", "v.npy", "q.yaml", "k.npy"], 2, "expected 1 to 3 inputs"),
    (["run", "k.npy", "--save", "out.xyz"], 2, "cannot save"),
]


@posix_only
@pytest.mark.parametrize(("args", "code", "words"), EXIT_CODES)
def test_exit_codes(work: Path, args: list[str], code: int, words: str) -> None:
    proc = subprocess.run([ATTNCLI, *args], cwd=work, env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, proc.stderr
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr


@posix_only
def test_exit_code_70_for_an_internal_error(work: Path) -> None:
    """An unexpected exception is exit 70 (EX_SOFTWARE) with one line (the traceback only with ATTNCLI_DEBUG=1)."""
    boom = ("import sys; import attncli.core.engine as e\n"
            "def bad(*a, **k): raise ZeroDivisionError('boom')\n"
            "e.run = bad\n"
            "from attncli.cli import main; sys.argv = ['attncli', 'run', 'k.npy']; main()\n")
    proc = subprocess.run([sys.executable, "-c", boom], cwd=work, env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 70, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "attncli: error: internal error: ZeroDivisionError: boom (set ATTNCLI_DEBUG=1 for the traceback, "
        "and please report it)"]
    debug = subprocess.run([sys.executable, "-c", boom], cwd=work, env={**ENV, "ATTNCLI_DEBUG": "1"},
                           capture_output=True, text=True, timeout=60)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


@pytest.mark.parametrize("where", ["mkstemp", "replace"])
def test_a_full_or_read_only_disk_is_exit_2_and_leaves_nothing(work: Path, where: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """No space left (or a read-only folder): one line naming the file and the reason, exit 2,
    the old file untouched and no temporary left behind."""
    import errno
    import tempfile

    (work / "out.npz").write_bytes(b"old")

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tempfile if where == "mkstemp" else os, "mkstemp" if where == "mkstemp" else "replace", fail)
    res = runner.invoke(app, ["run", str(work / "k.npy"), "--save", str(work / "out.npz"), "-q"])
    assert res.exit_code == 2, res.stderr
    assert res.stderr.strip() == f"attncli: error: {work / 'out.npz'}: cannot be written (No space left on device)"
    assert (work / "out.npz").read_bytes() == b"old"
    assert not [p for p in work.iterdir() if p.name.endswith(".tmp")]


def test_endless_stdin_stops_at_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cat /dev/zero | attncli run -` stops once stdin passes half the free memory (here
    pretended to be 8 MiB), with one line and exit 2, instead of filling the memory."""
    import io

    import attncli.io.files as aio

    class Zeros(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, b: bytearray) -> int:  # type: ignore[override]
            b[:] = bytes(len(b))
            return len(b)

    monkeypatch.setattr(aio, "memory_limit", lambda: 8 << 20)
    with pytest.raises(aio.InputError, match=r"<stdin>: sent more than 4.0 MiB"):
        aio.Reader(stdin=io.BufferedReader(Zeros())).read("-")
