"""Bounded on hostile sizes (issue 32, item 4):

- an 18 MB .npz whose member inflates to 4 GiB (a zip bomb) is refused from the sizes the archive declares, before
  anything is inflated: exit 2 in at most 2 s of CPU, naming the file, the member and how the cap is set
  (ATTNCLI_NPZ_MEMBER_MAX, default 4 GiB per member; the free memory bounds it too);
- ATTNCLI_NPZ_MEMBER_MAX sets the cap (a table: the value, the exit code, the words named and not named);
- explaining one row with 10^5 key labels (--explain-row 0) takes at most 2 s of CPU.

Each child runs under a memory cap; its CPU time (user + system, from wait4) is what the time cap bounds, so the
test holds on a busy machine, and a hang guard bounds its wall time."""

from __future__ import annotations

import io
import os
import resource
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
MEMORY_CAP = 1 << 30  # bytes of address space for each child: far below what inflating the bomb would need
CPU_CAP = 2.0  # seconds


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def attncli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr, CPU seconds of the child)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", **(env or {})}
    full.pop("ATTNCLI_DEBUG", None)
    with open(cwd / ".out", "w+b") as out, open(cwd / ".err", "w+b") as err:
        proc = subprocess.Popen([sys.executable, "-m", "attncli", *args], stdout=out, stderr=err, env=full, cwd=cwd,
                                preexec_fn=_cap)
        start = time.monotonic()
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > 300:  # a hang guard, not the measure
                proc.kill()
                pytest.fail(f"attncli {' '.join(args)[:80]} ran more than 300 s")
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read().decode(), err.read().decode(), usage.ru_utime + usage.ru_stime


# ---- a zip bomb, built in a moment -----------------------------------------------------------------------


def _times(mat: list[int], vec: int) -> int:
    s, i = 0, 0
    while vec:
        if vec & 1:
            s ^= mat[i]
        vec >>= 1
        i += 1
    return s


def _square(mat: list[int]) -> list[int]:
    return [_times(mat, mat[n]) for n in range(32)]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """zlib's crc32_combine (crc32.c): the CRC-32 of A + B from crc(A), crc(B) and len(B)."""
    if len2 <= 0:
        return crc1
    odd = [0xEDB88320] + [1 << n for n in range(31)]  # the operator for one zero bit
    even = _square(odd)
    odd = _square(even)
    while True:
        even = _square(odd)
        if len2 & 1:
            crc1 = _times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _square(even)
        if len2 & 1:
            crc1 = _times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2


def bomb(path: Path, gib: int = 4, name: str = "x.npy") -> None:
    """An .npz whose one member is an .npy of ``gib`` GiB of float64 zeros, deflated (level 1, as an 18 MB file): the
    stream is one 16 MiB block compressed once and repeated (after a full flush the compressor starts afresh, so
    each block compresses to the same bytes), with a true CRC-32 (combined, not computed over 4 GiB) and zip64
    headers written by hand (PKWARE APPNOTE 4.3.7, 4.3.12, 4.3.14-16, 4.5.3)."""
    chunk, count = 1 << 24, (gib << 30) >> 24
    hdr = io.BytesIO()
    np.lib.format.write_array_header_1_0(hdr, {"descr": "<f8", "fortran_order": False, "shape": ((gib << 30) // 8,)})
    head, zeros = hdr.getvalue(), bytes(chunk)
    co = zlib.compressobj(1, zlib.DEFLATED, -15)
    first = co.compress(head) + co.flush(zlib.Z_FULL_FLUSH)
    block = co.compress(zeros) + co.flush(zlib.Z_FULL_FLUSH)
    assert co.compress(zeros) + co.flush(zlib.Z_FULL_FLUSH) == block
    tail = co.flush()
    crc_zeros, n = zlib.crc32(zeros), chunk
    while n < count * chunk:  # the CRC of 2n zero bytes from that of n
        crc_zeros, n = crc32_combine(crc_zeros, crc_zeros, n), 2 * n
    crc = crc32_combine(zlib.crc32(head), crc_zeros, count * chunk)
    usize, csize = len(head) + count * chunk, len(first) + count * len(block) + len(tail)
    fname, big = name.encode(), 0xFFFFFFFF
    extra = struct.pack("<HHQQ", 1, 16, usize, csize)
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 8, 0, 0x21, crc, big, big, len(fname), len(extra)))
        f.write(fname + extra + first)
        for _ in range(count):
            f.write(block)
        f.write(tail)
        cd = f.tell()
        cextra = struct.pack("<HHQQQ", 1, 24, usize, csize, 0)
        f.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 8, 0, 0x21, crc, big, big, len(fname),
                            len(cextra), 0, 0, 0, 0, big) + fname + cextra)
        cd_size, z64 = f.tell() - cd, f.tell()
        f.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, 1, 1, cd_size, cd))
        f.write(struct.pack("<IIQI", 0x07064B50, 0, z64, 1))
        f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, cd_size, big, 0))


def test_the_bomb_is_what_it_says() -> None:
    import zipfile

    for a, b in ((b"attention", b"is all"), (b"", bytes(1000)), (os.urandom(64), bytes(4096))):
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    small = Path(os.environ.get("TMPDIR", "/tmp")) / f"attncli-bomb-{os.getpid()}.npz"
    try:
        bomb(small, gib=0)  # no zero blocks: the header alone, read back by zipfile and numpy
        with zipfile.ZipFile(small) as zf:
            info = zf.infolist()[0]
            assert info.file_size == 128 and zf.read(info)[:6] == b"\x93NUMPY"  # zipfile checks the CRC
    finally:
        small.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def zip_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bomb") / "bomb.npz"
    bomb(path)
    return path


def test_a_4_gib_member_is_refused_before_inflating(zip_bomb: Path) -> None:
    import zipfile

    assert zip_bomb.stat().st_size < 20e6
    with zipfile.ZipFile(zip_bomb) as zf:
        assert zf.infolist()[0].file_size > 4 << 30
    code, out, err, cpu = attncli("run", zip_bomb.name, cwd=zip_bomb.parent)
    assert code == 2 and out == "", err
    line = err.strip()
    assert len(line.splitlines()) == 1 and len(line) < 300, err
    for word in ("bomb.npz", "'x'", "ATTNCLI_NPZ_MEMBER_MAX", "4 GiB"):
        assert word in line, (word, line)
    assert "internal error" not in line and "free memory" not in line
    assert cpu <= CPU_CAP, f"{cpu:.2f} s of CPU to refuse it"


CAPS = [  # ATTNCLI_NPZ_MEMBER_MAX, exit code, words named, words not named (a 720,128-byte member)
    ("100K", 2, ["q.npz", "'q'", "720,128 bytes", "ATTNCLI_NPZ_MEMBER_MAX=100K"], ["internal error"]),
    ("700000", 2, ["q.npz", "ATTNCLI_NPZ_MEMBER_MAX=700000"], ["internal error"]),
    ("1M", 0, [], ["error"]),
    ("1MiB", 0, [], ["error"]),
    ("", 0, [], ["error"]),  # empty: the default
    ("1x", 2, ["ATTNCLI_NPZ_MEMBER_MAX", "'1x'"], ["q.npz", "internal error"]),
    ("0", 2, ["ATTNCLI_NPZ_MEMBER_MAX"], ["q.npz", "internal error"]),
    ("-5G", 2, ["ATTNCLI_NPZ_MEMBER_MAX"], ["q.npz", "internal error"]),
]


@pytest.mark.parametrize(("value", "code", "named", "not_named"), CAPS, ids=[c[0] or "empty" for c in CAPS])
def test_the_member_cap_is_set_by_the_environment(value: str, code: int, named: list[str], not_named: list[str],
                                                  tmp_path: Path) -> None:
    np.savez(tmp_path / "q.npz", q=np.ones((300, 300)))  # one member: 128 + 720,000 bytes
    got, out, err, _ = attncli("run", "q.npz", "-q", cwd=tmp_path, env={"ATTNCLI_NPZ_MEMBER_MAX": value})
    assert got == code, err
    assert len(err.strip().splitlines()) == (1 if code else 0) and out == ""
    for w in named:
        assert w in err, (w, err)
    for w in not_named:
        assert w not in err, (w, err)


def test_explaining_a_row_of_100000_labelled_keys_is_fast(tmp_path: Path) -> None:
    n = 100_000
    r = np.random.default_rng(0)
    labels = np.array([f"tok{j}" for j in range(n)])
    k, v = r.normal(size=(n, 8)), r.normal(size=(n, 8))
    q = r.normal(size=(1, 8))
    np.savez(tmp_path / "p.npz", q=q, k=k, v=v, key_labels=labels)
    code, out, err, cpu = attncli("run", "p.npz", "--explain-row", "0", cwd=tmp_path)
    assert code == 0, err
    s = q @ k.T / np.sqrt(8)  # (1, n): the row by hand (float64), its strongest key named by its label
    assert f"tok{int(np.argmax(s))}" in out and "more keys with smaller weights" in out
    y = (np.exp(s - s.max()) / np.exp(s - s.max()).sum()) @ v  # (1, n) x (n, 8) -> (1, 8)
    assert f"{y[0, 0]:.4f}" in out.split("= (")[-1]  # the output row as the sum of the value rows
    assert cpu <= CPU_CAP, f"{cpu:.2f} s of CPU to explain one row of {n} keys"


@pytest.mark.parametrize("spec", ["1,LONG", "LONG,3", "1,nope"])
def test_a_long_label_leaves_room_for_the_reason(spec: str, tmp_path: Path) -> None:
    """Labels of 2,000 characters (kept as 200 printable ones): a label given to --explain that names no key is
    refused in one line that still says why and what to give (the given text and the labels shown cut short)."""
    n, long = 1_000, "x" * 2_000
    r = np.random.default_rng(3)
    np.savez(tmp_path / "p.npz", q=r.normal(size=(2, 8)), k=r.normal(size=(n, 8)), v=r.normal(size=(n, 8)),
             key_labels=np.array([f"{long}{j}" for j in range(n)]))
    code, out, err, _ = attncli("run", "p.npz", "-x", spec.replace("LONG", long + "77"), cwd=tmp_path)
    line = err.strip()
    assert code == 2 and out == "" and len(line.splitlines()) == 1 and len(line) < 300, err[-300:]
    assert "--explain" in line and "internal error" not in line
    assert ("no key named" in line and "give an index 0..999" in line) if spec.startswith("1,") else \
        "no query named" in line and "give an index 0..1" in line, line


def test_explaining_a_row_of_100000_long_labels_is_fast(tmp_path: Path) -> None:
    """10^5 key labels of 300 characters each (kept as 200 printable ones: only what is kept is read and escaped)."""
    n = 100_000
    r = np.random.default_rng(5)
    labels = np.array([f"{j:06d}" + "é" * 294 for j in range(n)])
    k, v, q = r.normal(size=(n, 4)), r.normal(size=(n, 4)), r.normal(size=(1, 4))
    np.savez_compressed(tmp_path / "p.npz", q=q, k=k, v=v, key_labels=labels)
    code, out, err, cpu = attncli("run", "p.npz", "--explain-row", "0", cwd=tmp_path)
    assert code == 0, err
    s = q @ k.T / 2.0  # (1, n): the row by hand, float64; its strongest key named by its label's first characters
    assert f"{int(np.argmax(s)):06d}éé" in out
    assert cpu <= CPU_CAP, f"{cpu:.2f} s of CPU to explain one row of {n} keys with long labels"
