"""ddptui.safeio: the one reader of run-directory files and the one output writer, and the
run-directory readers built on them (property-based: whatever bytes config.json, summary.json
or events.jsonl hold, a reader answers or raises RunDirError, never anything else)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddptui import protocol, safeio
from ddptui.run.rundir import RunDirError, iter_events, load_run, read_config, read_summary
from ddptui.runfiles import RunDir
from tests.data_fixtures.record import RUNS

RUN = RUNS / "amp-off"
PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _char_device(path: Path, minor: int) -> Path:
    """A scratch copy of /dev/null (minor 3) or /dev/full (minor 7), or skip without root."""
    try:
        os.mknod(path, 0o666 | 0o020000, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("mknod needs root")
    return path


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "64k", read_only: bool = False):
    """A tmpfs of ``size`` mounted at ``where`` (skip where mount is not permitted)."""
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


# -- reading --------------------------------------------------------------------------------------
def test_open_regular_refuses_a_fifo_at_once(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="a FIFO, not a regular file"):
        safeio.read_regular(tmp_path / "fifo", 100)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.symlink_to("/dev/zero"), "a character device, not a regular file"),
        (lambda p: p.mkdir(), "Is a directory|a directory, not a regular file"),
        (lambda p: p.write_bytes(b"x" * 101), "too large"),
        (lambda p: None, "No such file"),
    ],
)
def test_read_regular_refuses(tmp_path, make, message):
    make(tmp_path / "f")
    with pytest.raises(OSError, match=message):
        safeio.read_regular(tmp_path / "f", 100)


def test_a_symlink_to_a_regular_file_is_read(tmp_path):
    (tmp_path / "real").write_bytes(b"{}")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert safeio.read_json(tmp_path / "link", 100) == {}


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("1", 0),
        ("[]", 1),
        ('{"a": [[{}]]}', 4),
        ('["[[[[", "\\"]]]"]', 1),  # brackets inside strings do not count
        ("[" * 100_000 + "]" * 100_000, 100_000),
    ],
)
def test_json_depth(text, depth):
    assert safeio.json_depth(text) == depth


def test_deep_json_is_a_value_error_not_a_recursion_error():
    with pytest.raises(ValueError, match="nested more than 64 levels"):
        safeio.loads_bounded("[" * 100_000 + "]" * 100_000)
    assert safeio.loads_bounded("[" * 64 + "]" * 64)


def test_read_lines_skips_a_line_too_long_to_hold(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"a\n" + b"x" * 5000 + b"\nb\n" + b"y" * 5000)
    with open(path, "rb") as f:
        assert list(safeio.read_lines(f, 100)) == [b"a\n", b"b\n"]


@pytest.mark.parametrize("path", ["x" * 5000, "a\x00b", "", "/etc/hostname/x"])
def test_is_file_and_is_dir_never_raise(path):
    assert not safeio.is_file(path)
    assert not safeio.is_dir(path)


# -- the readers of a run directory, on any bytes (property-based) --------------------------------
@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("hostile")


def _fresh_run(base: Path, name: str) -> Path:
    run = base / name
    if run.exists():
        shutil.rmtree(run)
    shutil.copytree(RUN, run)
    return run


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
hostile_bytes = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 5000).map(lambda n: b'{"world_size": 2, "x": ' + b"[" * n + b"]" * n + b"}"),
    st.dictionaries(
        st.sampled_from(["world_size", "run_id", "epochs", "outcome", "exit_code", "failure"]),
        json_values,
    ).map(lambda d: json.dumps(d).encode()),
)


@PROPERTY
@given(data=hostile_bytes)
def test_read_config_answers_or_says_why(scratch, data):
    run = _fresh_run(scratch, "config")
    RunDir(run).config.write_bytes(data)
    try:
        doc = read_config(run)
    except RunDirError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 600
    else:
        assert isinstance(doc, dict) and isinstance(doc.get("world_size", 1), int)


@PROPERTY
@given(data=hostile_bytes)
def test_read_summary_answers_or_is_none(scratch, data):
    run = _fresh_run(scratch, "summary")
    RunDir(run).summary.write_bytes(data)
    doc = read_summary(run)
    assert doc is None or isinstance(doc, dict)
    load_run(run)  # and the whole run still loads (from its events when summary.json is bad)


event_lines = st.lists(
    st.one_of(
        st.binary(max_size=200),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.integers(1, 3000).map(lambda n: b'{"v":1,"kind":"step","x":' + b"[" * n + b"]" * n),
        st.builds(
            lambda seq, rank: json.dumps(
                {"v": 1, "run": "amp-off", "rank": rank, "kind": "step", "t": 1.0, "seq": seq}
                | {"epoch": 1, "step": 1}
            ).encode(),
            st.integers(-(2**70), 2**70),
            st.integers(-3, 3),
        ),
    ),
    max_size=20,
)


@PROPERTY
@given(lines=event_lines, torn=st.booleans())
def test_events_jsonl_of_any_lines_replays(scratch, lines, torn):
    run = _fresh_run(scratch, "events")
    with open(RunDir(run).events, "ab") as f:
        f.write(b"\n".join(lines) + (b"" if torn else b"\n"))
    for event in iter_events(run):
        assert isinstance(event, protocol.AnyEvent.__args__)  # type: ignore[attr-defined]
    config, state, summary = load_run(run)
    assert summary["outcome"] and state.dropped >= 0


# -- writing --------------------------------------------------------------------------------------
def _write(path, text="a,b\n"):
    return safeio.write_output(path, lambda f: f.write(text))


@pytest.mark.parametrize(
    "name", ["events.jsonl", "config.json", "summary.json", "checkpoint.pt", "rank-0.log", "new"]
)
def test_an_output_never_replaces_a_file_of_a_run_directory(tmp_path, name):
    run = _fresh_run(tmp_path, "run")
    (run / "checkpoint.pt").write_bytes(b"model")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    if name == "new":  # a new name in a run directory is allowed: it replaces nothing
        _write(run / "export.csv")
        assert (run / "export.csv").read_text() == "a,b\n"
        return
    with pytest.raises(OSError, match="refusing to overwrite: it is a file of the run dir"):
        _write(run / name)
    link = tmp_path / "innocent.csv"
    link.symlink_to(run / name)
    with pytest.raises(OSError, match="refusing to overwrite"):
        _write(link)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_a_character_device_is_written_as_a_stream(tmp_path):
    null = _char_device(tmp_path / "null", 3)
    full = _char_device(tmp_path / "full", 7)
    _write(null)
    assert null.is_char_device()
    with pytest.raises(OSError) as info:
        _write(full, "x" * 100_000)
    assert info.value.errno == errno.ENOSPC and full.is_char_device()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "null"]  # no temp file


def test_a_fifo_is_written_as_a_stream(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    _write(fifo, "hello\n")
    reader.join(10)
    assert got == ["hello\n"] and fifo.is_fifo()


def test_a_symlink_is_followed_and_stays_a_symlink(tmp_path):
    (tmp_path / "target.csv").write_text("old")
    (tmp_path / "link.csv").symlink_to(tmp_path / "target.csv")
    _write(tmp_path / "link.csv")
    assert (tmp_path / "link.csv").is_symlink()
    assert (tmp_path / "target.csv").read_text() == "a,b\n"


def test_a_socket_is_refused(tmp_path):
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
        with pytest.raises(OSError, match="a socket: not a file an output can replace"):
            _write(tmp_path / "sock")


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    (tmp_path / "out.csv").write_text("old")

    def boom(f):
        f.write("partial")
        raise OSError(errno.EIO, "I/O error")

    with pytest.raises(OSError, match="I/O error"):
        safeio.write_output(tmp_path / "out.csv", boom)
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]
    assert (tmp_path / "out.csv").read_text() == "old"


def test_a_read_only_directory_fails_once_without_a_second_error(tmp_path):
    with small_tmpfs(tmp_path / "ro", read_only=True) as ro:
        with pytest.raises(OSError) as info:
            _write(ro / "out.csv")
        assert info.value.errno == errno.EROFS
        assert info.value.__context__ is None  # the cleanup raised nothing of its own


# -- appending whole lines ------------------------------------------------------------------------
def test_a_full_disk_leaves_only_whole_lines(tmp_path):
    with small_tmpfs(tmp_path / "small", size="16k") as small:
        appender = safeio.LineAppender(small / "events.jsonl")
        line = b'{"n": 1, "pad": "' + b"x" * 300 + b'"}\n'
        with pytest.raises(OSError) as info:
            for _ in range(1000):
                appender.append(line * 3)
        appender.close()
        assert info.value.errno == errno.ENOSPC
        data = (small / "events.jsonl").read_bytes()
        assert data and data.endswith(b"\n") and len(data) % len(line) == 0
        assert all(json.loads(x) for x in data.splitlines())


def test_a_torn_tail_left_by_a_crash_is_cut_at_open(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a"')
    appender = safeio.LineAppender(path)
    appender.append(b'{"a": 3}\n')
    appender.close()
    assert path.read_bytes() == b'{"a": 1}\n{"a": 2}\n{"a": 3}\n'


def test_the_appender_notices_its_file_deleted(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    appender = safeio.LineAppender(run / "events.jsonl")
    assert not appender.deleted()
    shutil.rmtree(run)
    assert appender.deleted()
    run.mkdir()  # recreated, with a new events.jsonl: still not the file it writes
    (run / "events.jsonl").write_bytes(b"")
    assert appender.deleted()
    appender.close()


def test_a_fifo_as_the_events_file_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "events.jsonl")
    with pytest.raises(OSError, match="a FIFO, not a regular file"):
        safeio.LineAppender(tmp_path / "events.jsonl")


def test_a_stale_temp_file_or_planted_symlink_is_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / f".out.csv.{os.getpid()}.tmp").symlink_to(victim)
    _write(tmp_path / "out.csv")
    assert victim.read_text() == "keep" and (tmp_path / "out.csv").read_text() == "a,b\n"


def test_an_interrupt_between_partial_writes_leaves_no_partial_line(tmp_path, monkeypatch):
    """Ctrl-C's exception, raised between two writes of one append: the file keeps its whole
    lines only."""
    path = tmp_path / "events.jsonl"
    appender = safeio.LineAppender(path)
    appender.append(b'{"a": 1}\n')
    real_write, calls = os.write, []

    def write(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:5]))  # a partial write
        raise KeyboardInterrupt

    monkeypatch.setattr(safeio.os, "write", write)
    with pytest.raises(KeyboardInterrupt):
        appender.append(b'{"b": 2}\n{"c": 3}\n')
    monkeypatch.setattr(safeio.os, "write", real_write)
    appender.append(b'{"d": 4}\n')
    assert path.read_bytes() == b'{"a": 1}\n{"d": 4}\n'
