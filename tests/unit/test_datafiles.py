"""ddl.contract.datafiles, the data-directory helpers every workload uses: a new set replaces the old
one only when complete (also when the writer is killed), real data is never overwritten by a
generator, and failures are one line. Real files, a real SIGKILL and the real CLI."""

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from email.message import Message
from pathlib import Path
from urllib.error import HTTPError, URLError

import pytest

from conftest import assert_one_line_error, run_ddl
from ddl.contract import datafiles
from ddl.contract.errors import DataError, DdlError

pytestmark = pytest.mark.unit


def _old_set(parent: Path) -> Path:
    target = parent / "dataset"
    (target / "raw").mkdir(parents=True)
    (target / "raw" / "train.bin").write_bytes(b"old train")
    (target / "labels.txt").write_text("old labels\n")
    return target


def _contents(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# --- replacing a directory ------------------------------------------------------------------


def test_replacing_swaps_in_the_complete_set_and_leaves_nothing_else(tmp_path):
    target = _old_set(tmp_path)
    with datafiles.replacing(target, "synthetic") as new:
        assert new.is_dir() and not any(new.iterdir())
        assert _contents(target) == {"raw/train.bin": b"old train", "labels.txt": b"old labels\n"}
        (new / "train.bin").write_bytes(b"new train")
    assert _contents(target) == {"train.bin": b"new train"}
    assert [p.name for p in tmp_path.iterdir()] == ["dataset"]  # no scratch or old-* folders


def test_an_error_while_writing_leaves_the_old_set_intact(tmp_path):
    target = _old_set(tmp_path)
    before = _contents(target)
    with pytest.raises(RuntimeError, match="generator broke"):
        with datafiles.replacing(target) as new:
            (new / "train.bin").write_bytes(b"half of the new set")
            raise RuntimeError("generator broke")
    assert _contents(target) == before
    assert [p.name for p in tmp_path.iterdir()] == ["dataset"]


def test_a_killed_writer_leaves_the_old_set_intact(tmp_path):
    """SIGKILL runs no cleanup: the half-written set stays in a hidden scratch folder, and
    the directory a training job reads is still the complete old one."""
    target = _old_set(tmp_path)
    before = _contents(target)
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from ddl.contract import datafiles
        with datafiles.replacing(Path({str(target)!r}), "synthetic") as new:
            (new / "train.bin").write_bytes(b"half of the new set")
            print("writing", flush=True)
            sys.stdin.read()  # held here until killed
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "writing"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        child.stdin.close()
        child.stdout.close()
    assert _contents(target) == before
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "dataset"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".dataset-synthetic-"), leftovers


def test_install_puts_the_old_set_back_when_the_new_one_cannot_be_renamed(tmp_path):
    target = _old_set(tmp_path)
    before = _contents(target)
    with pytest.raises(FileNotFoundError):
        datafiles.install(tmp_path / "never-written", target)
    assert _contents(target) == before
    assert [p.name for p in tmp_path.iterdir()] == ["dataset"]


def test_install_into_an_empty_place(tmp_path):
    new = tmp_path / "new"
    (new / "a").mkdir(parents=True)
    (new / "a" / "b.txt").write_text("b")
    datafiles.install(new, tmp_path / "dataset")
    assert _contents(tmp_path / "dataset") == {"a/b.txt": b"b"}
    assert not new.exists()


# --- guarding real data, the data directory ----------------------------------------------


def test_protect_real_data_refuses_unmarked_files_only(tmp_path):
    target = tmp_path / "dataset"
    datafiles.protect_real_data(target, "Foo")  # absent
    (target / "empty" / "folders").mkdir(parents=True)
    datafiles.protect_real_data(target, "Foo")  # no files
    (target / "train.bin").write_bytes(b"downloaded")
    with pytest.raises(DataError) as info:
        datafiles.protect_real_data(target, "Foo")
    message = str(info.value)
    assert "refusing to overwrite" in message and "real Foo data?" in message
    assert "\n" not in message
    (target / datafiles.MARKER).write_text("generated\n")
    assert datafiles.is_synthetic(target)
    datafiles.protect_real_data(target, "Foo")  # a generated set may be replaced


def test_new_synthetic_set_refuses_real_data_before_writing(tmp_path):
    target = tmp_path / "data" / "dataset"
    with datafiles.new_synthetic_set(target, "Foo") as new:  # creates the data directory
        (new / datafiles.MARKER).write_text("generated\n")
    (target / "downloaded.bin").write_bytes(b"real")
    (target / datafiles.MARKER).unlink()
    with pytest.raises(DataError, match="refusing to overwrite"):
        with datafiles.new_synthetic_set(target, "Foo"):
            raise AssertionError("the block must not run")
    assert _contents(target) == {"downloaded.bin": b"real"}


def test_make_data_dir_fails_in_one_line(tmp_path):
    (tmp_path / "a-file").write_text("x")
    datafiles.make_data_dir(tmp_path / "new" / "data")
    assert (tmp_path / "new" / "data").is_dir()
    with pytest.raises(DataError, match=r"cannot create data directory .*a-file/data: ") as info:
        datafiles.make_data_dir(tmp_path / "a-file" / "data")
    assert "\n" not in str(info.value)


def test_prepare_into_an_impossible_directory_is_one_line_exit_2(tmp_path):
    (tmp_path / "a-file").write_text("x")
    proc = run_ddl("prepare", "--plugin", "mnist", "--synthetic", "--data-dir",
                   str(tmp_path / "a-file" / "data"), cwd=tmp_path)
    assert_one_line_error(proc, "cannot create data directory", "a-file")


# --- one-line download failures -----------------------------------------------------------


_FOO = {"dataset": "Foo", "source": "https://foo.example/foo.tgz", "plugin": "foo"}


@pytest.mark.parametrize("exc, reason", [
    (URLError(socket.gaierror(-2, "Name or service not known")), "Name or service not known"),
    (HTTPError("https://x", 404, "Not Found", Message(), None), "HTTP 404 Not Found"),
    (RuntimeError("Error downloading x:\nTried a, got:\ntimed out\n"), "Error downloading x:"),
    (TimeoutError(), "TimeoutError"),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "reset by peer"),
])
def test_a_network_failure_is_one_line_naming_the_reason(tmp_path, exc, reason):
    error = datafiles.download_failure(exc, tmp_path, **_FOO)
    assert type(error) is DdlError and error.exit_code == 1
    message = str(error)
    assert message.startswith("could not download Foo from https://foo.example/foo.tgz (")
    assert reason in message and "\n" not in message
    assert f"run `ddl prepare --plugin foo --data-dir {tmp_path}` on a login node" in message


def test_a_full_disk_is_not_called_a_network_failure(tmp_path):
    exc = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))
    error = datafiles.download_failure(exc, tmp_path, **_FOO)
    assert str(error) == f"could not write Foo to {tmp_path}: No space left on device"
    # the same errno inside a URLError is the network's, not this disk's
    wrapped = URLError(OSError(errno.EACCES, "Permission denied"))
    assert str(datafiles.download_failure(wrapped, tmp_path, **_FOO)) \
        .startswith("could not download Foo")


def test_long_reasons_are_clipped():
    reason = datafiles.short_reason(RuntimeError("x" * 500 + "\nsecond line"))
    assert len(reason) == 160 and reason.endswith("...")
    assert datafiles.first_line("\n\n  first  \nsecond") == "first"
    assert datafiles.first_line("") == ""


def test_without_hint_drops_only_the_prepare_command(tmp_path):
    hint = datafiles.prepare_hint("foo", tmp_path / "scratch")
    assert hint.startswith("run `ddl prepare --plugin foo --data-dir ")
    error = DataError(f"corrupt file {tmp_path}/a; b: truncated; {hint}")
    assert datafiles.without_hint(error) == f"corrupt file {tmp_path}/a; b: truncated"


def test_quiet_download_restores_the_timeout_and_hides_library_output(capfd):
    before = socket.getdefaulttimeout()
    with pytest.raises(ValueError):
        with datafiles.quiet_download(3.5):
            assert socket.getdefaulttimeout() == 3.5
            print("Downloading https://... 100%")
            print("progress", file=sys.stderr)
            raise ValueError("boom")
    assert socket.getdefaulttimeout() == before
    out, err = capfd.readouterr()
    assert out == "" and err == ""


# --- md5 manifests ------------------------------------------------------------------------


def test_md5_manifest_is_what_md5sum_checks(tmp_path):
    blobs = {"data_1": b"abc", "meta": os.urandom(3000)}
    for name, blob in blobs.items():
        (tmp_path / name).write_bytes(blob)
    text = datafiles.md5_manifest(blobs)
    assert datafiles.parse_md5_manifest(text) == {
        name: datafiles.md5_of(tmp_path / name) for name in blobs}
    assert datafiles.parse_md5_manifest(text)["data_1"] == "900150983cd24fb0d6963f7d28e17f72"
    (tmp_path / "sums.md5").write_text(text)
    md5sum = shutil.which("md5sum")
    assert md5sum, "md5sum (coreutils) not found"
    proc = subprocess.run([md5sum, "-c", "sums.md5"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tmp_path / "meta").write_bytes(b"damaged")
    proc = subprocess.run([md5sum, "-c", "sums.md5"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert proc.returncode == 1 and "meta: FAILED" in proc.stdout
