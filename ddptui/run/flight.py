"""Which rank is stuck, in which collective, and why: torch's Flight Recorder, read by ddptui.

Every rank records its collectives (see :mod:`ddptui.rank.flight_recorder`). When a verdict is
due, or the user asks, ddptui asks every rank for its trace (:func:`request_traces`: one line on the
rank's Unix socket; the rank's own thread answers, whatever its main thread is doing), loads
the ``fr-rank-N.json`` files (:func:`load_traces`, validated and capped) and runs torch's own
analyzer, ``torch.distributed.flight_recorder`` (``build_db``: it pairs every rank's
collectives by process group and sequence number and records the first that does not match).
:func:`findings` turns its result into lines a person can act on:

* ``rank 1 never entered all_reduce #812 (default_pg, 4,420 floats, DDP bucket) that rank 0
  waits in (from train.py:88); rank 1 is in load_batch (data.py:41)`` — cause ``hang``;
* ``rank 1 called all_reduce #57 with 3 floats (from train.py:61) where rank 0 called it with
  4,420 floats (DDP bucket, from train.py:88): a desync`` — cause ``desync``.

No matching of ours: the pairing is torch's; ddptui only names what torch found.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddptui.formatting import ranks_text
from ddptui.rank.flight_recorder import REQUEST, group_label, socket_path
from ddptui.rank.frames import DDP_FILE, DDP_NATIVE, ddp_purpose, is_library, traceback_files
from ddptui.run.collector import listening, stale_private_dirs
from ddptui.runfiles import trace_name

#: Largest trace file read (2,000 entries with stacks are ~2 MB).
MAX_TRACE_BYTES = 64 * 1024 * 1024
#: Longest answer line read from a rank.
MAX_ANSWER = 256
#: How long one request may take (the rank dumps and writes its file before it answers; the
#: first dump of a full buffer symbolizes its stacks: about 1 s for 2,000 entries, measured).
REQUEST_TIMEOUT_S = 10.0
#: At most this many requests in flight at once.
MAX_PARALLEL = 32
_DIR_PREFIX = "ddptui-fr-"
#: Plural nouns for element types in a line ("4,420 floats").
_DTYPE_NOUNS = {
    "Float": "floats",
    "Double": "doubles",
    "Half": "halves",
    "BFloat16": "bfloat16s",
    "Long": "int64s",
    "Int": "int32s",
    "Bool": "bools",
    "Byte": "uint8s",
    "Char": "int8s",
}


# -- asking the ranks ----------------------------------------------------------------------
def make_socket_dir() -> Path:
    """A new private (0700) directory for the ranks' request sockets, with a path short
    enough for a Unix socket name. The caller removes it (:func:`remove_socket_dir`)."""
    for base in (os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir(), "/tmp"):
        if not base or not os.path.isdir(base) or not os.access(base, os.W_OK | os.X_OK):
            continue
        if len(os.path.join(base, _DIR_PREFIX + "X" * 10, "99999.sock").encode()) > 100:
            continue
        remove_stale_socket_dirs(base)
        path = Path(tempfile.mkdtemp(prefix=_DIR_PREFIX, dir=base))
        os.chmod(path, 0o700)
        return path
    raise OSError("no writable directory with a short enough path for the trace sockets")


#: A socket directory left this long by a ddptui that was killed (its close never ran) goes.
STALE_AFTER_S = 24 * 3600


def remove_stale_socket_dirs(base: str) -> None:
    """Remove this user's socket directories that a killed ddptui left behind: named and
    private like one, a day old, holding nothing but sockets nobody listens on."""
    for path in stale_private_dirs(base, _DIR_PREFIX, STALE_AFTER_S):
        try:
            inside = list(Path(path).iterdir())
        except OSError:
            continue
        if any(not p.name.endswith(".sock") or listening(str(p)) for p in inside):
            continue
        remove_socket_dir(path)


def remove_socket_dir(path: str | os.PathLike[str] | None) -> None:
    """Remove a directory made by :func:`make_socket_dir` (sockets left by the ranks)."""
    if not path:
        return
    path = Path(path)
    try:
        for entry in path.iterdir():
            if entry.name.endswith(".sock"):
                entry.unlink(missing_ok=True)
        path.rmdir()
    except OSError:
        pass


def _ask(path: Path, timeout: float, request: bytes = REQUEST) -> str:
    """One request: ``ok`` or why not (one line)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(path))
            conn.sendall(request + b"\n")
            answer = b""
            while b"\n" not in answer and len(answer) < MAX_ANSWER:
                chunk = conn.recv(MAX_ANSWER - len(answer))
                if not chunk:
                    break
                answer += chunk
    except FileNotFoundError:
        return "no trace socket (recorder off, or the rank has not started or is gone)"
    except ConnectionRefusedError:
        return "the rank is gone"
    except TimeoutError:
        return f"no answer in {timeout:g} s"
    except OSError as exc:
        return f"cannot ask: {exc.strerror or exc}"
    line = answer.partition(b"\n")[0].decode("utf-8", "replace").strip()
    return line[:MAX_ANSWER] or "no answer"


def request_traces(
    socket_dir: str | os.PathLike[str],
    ranks: Iterable[int],
    timeout: float = REQUEST_TIMEOUT_S,
    request: bytes = REQUEST,
) -> dict[int, str]:
    """Ask every rank in ``ranks`` to write ``fr-rank-N.json`` (or, with
    :data:`~ddptui.rank.flight_recorder.STACKS_REQUEST`, its stacks); rank -> ``ok`` or why
    not. Requests run in parallel; the whole takes at most about ``timeout`` seconds per batch
    of :data:`MAX_PARALLEL` ranks."""
    ranks = sorted(set(ranks))
    answers: dict[int, str] = {}

    def worker(batch: list[int]) -> None:
        for rank in batch:
            answers[rank] = _ask(socket_path(socket_dir, rank), timeout, request)

    lanes = [ranks[i::MAX_PARALLEL] for i in range(min(MAX_PARALLEL, len(ranks)))]
    threads = [threading.Thread(target=worker, args=(lane,), daemon=True) for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


# -- reading the traces --------------------------------------------------------------------
class TraceError(ValueError):
    """A trace file that is not what a rank writes; ``str()`` is one line."""


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) for v in value)


def _valid_entry(e: Any) -> bool:
    """An entry with every field torch's analyzer reads, of the type it expects."""
    if not isinstance(e, dict):
        return False
    pg = e.get("process_group")
    frames = e.get("frames", [])
    return (
        isinstance(e.get("record_id"), int)
        and isinstance(e.get("collective_seq_id"), int)
        and isinstance(e.get("p2p_seq_id"), int)
        and isinstance(e.get("profiling_name"), str)
        and ":" in e["profiling_name"]
        and isinstance(pg, list)
        and len(pg) == 2
        and all(isinstance(p, str) for p in pg)
        and all(_ints(s) for s in e.get("input_sizes", [None]))
        and all(_ints(s) for s in e.get("output_sizes", [None]))
        and isinstance(e.get("input_sizes"), list)
        and isinstance(e.get("output_sizes"), list)
        and all(isinstance(d, str) for d in e.get("input_dtypes", [None]))
        and all(isinstance(d, str) for d in e.get("output_dtypes", [None]))
        and isinstance(e.get("state"), str)
        and isinstance(e.get("is_p2p"), bool)
        and isinstance(e.get("time_created_ns"), int)
        and isinstance(frames, list)
        and all(
            isinstance(f, dict)
            and isinstance(f.get("name"), str)
            and isinstance(f.get("filename"), str)
            and isinstance(f.get("line"), int)
            for f in frames
        )
    )


def parse_trace(text: str | bytes) -> dict:
    """A trace file's document, checked field by field (:class:`TraceError` otherwise)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise TraceError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rank"), int):
        raise TraceError("not a Flight Recorder trace written by ddptui")
    entries = doc.get("entries")
    if not isinstance(entries, list) or not all(_valid_entry(e) for e in entries):
        raise TraceError("malformed entries")
    if not isinstance(doc.get("pg_config", {}), dict) or not isinstance(
        doc.get("pg_status", {}), dict
    ):
        raise TraceError("malformed process-group tables")
    if entries and not isinstance(doc.get("version"), str):
        raise TraceError("no recorder version")
    return doc


#: What tells one writing of a trace file from another: (inode, mtime in ns, size). A rank
#: writes its trace to a temporary file and renames it over the last one.
Stamp = tuple[int, int, int]


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def load_traces(
    run_dir: str | os.PathLike[str],
    ranks: Iterable[int],
    stamps: dict[int, Stamp] | None = None,
    skip: Mapping[int, Stamp] | None = None,
) -> tuple[dict[int, dict], dict[int, str]]:
    """Read ``fr-rank-N.json`` for every rank: (rank -> trace, rank -> why it is missing).
    ``stamps`` gets each file read's :data:`Stamp`; a file still as ``skip`` has it (one
    ddptui asked for while the run went on, not written since) is missing."""
    traces: dict[int, dict] = {}
    missing: dict[int, str] = {}
    for rank in sorted(set(ranks)):
        path = Path(run_dir) / trace_name(rank)
        try:
            # O_NONBLOCK: a FIFO put in a trace's place does not hold the read forever
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise TraceError("not a regular file")
                stamp = _stamp(st)
                if skip is not None and skip.get(rank) == stamp:
                    missing[rank] = "only the trace asked for while the run went on"
                    continue
                if stamp[2] > MAX_TRACE_BYTES:
                    raise TraceError(f"larger than {MAX_TRACE_BYTES} bytes")
                doc = parse_trace(f.read(MAX_TRACE_BYTES + 1))
            if doc["rank"] != rank:
                raise TraceError(f"written by rank {doc['rank']}")
            traces[rank] = doc
            if stamps is not None:
                stamps[rank] = stamp
        except FileNotFoundError:
            missing[rank] = "no trace file"
        except (OSError, TraceError) as exc:
            missing[rank] = f"{path.name}: {exc}"
    return traces, missing


# -- torch's analyzer ------------------------------------------------------------------------
def _pg_configs(traces: Mapping[int, dict], world_size: int) -> dict[int, dict]:
    """Per rank, torch's ``pg_config`` keyed by the process-group names its entries carry.

    gloo's recorder names the groups in its entries (``["0", "default_pg"]``) but may leave
    its ``pg_config`` unnamed; torch's analyzer looks groups up by the entries' names. A
    named table is kept; the default group is every rank; another unnamed group is the ranks
    whose traces mention it."""
    mentions: dict[str, set[int]] = {}
    for rank, doc in traces.items():
        for e in doc["entries"]:
            mentions.setdefault(e["process_group"][0], set()).add(rank)
    out: dict[int, dict] = {}
    for rank, doc in traces.items():
        named = {k: v for k, v in (doc.get("pg_config") or {}).items() if k}
        config: dict[str, dict] = {}
        for e in doc["entries"]:
            name, desc = e["process_group"]
            if name in config:
                continue
            given = named.get(name)
            if isinstance(given, dict) and isinstance(given.get("ranks"), str):
                ranks = given["ranks"]
            elif desc == "default_pg":
                ranks = str(list(range(world_size)))
            else:
                ranks = str(sorted(mentions[name]))
            config[name] = {"desc": desc, "ranks": ranks}
        out[rank] = config
    return out


def _gathers_mended(entries: list[dict], config: Mapping[str, dict]) -> list[dict]:
    """``entries`` with gloo's functional all_gathers given the output torch's analyzer
    checks for. gloo's recorder writes a functional all_gather's output
    (``funcol.all_gather_tensor``: DTensor's, torchtitan's attention masks) as one rank's
    share, ``[1, 16, 8]`` for a gather of ``[16, 8]`` over 2 ranks (torch 2.15), on every
    rank alike, where ``all_gather_into_tensor`` and ``all_gather`` record ``[2, 16, 8]``;
    the analyzer takes each for a size mismatch, and stops pairing after 10. Only that
    shape, of a group of more ranks, is mended (to ``[ranks, 16, 8]``)."""
    sizes: dict[str, int] = {}  # each group's ranks, read once
    for e in entries:
        inputs, outputs = e.get("input_sizes"), e.get("output_sizes")
        if (
            e.get("profiling_name") != "gloo:all_gather"
            or len(inputs) != 1
            or len(outputs) != 1
            or outputs[0] != [1, *inputs[0]]
        ):
            continue
        name = e["process_group"][0]
        if name not in sizes:
            try:
                sizes[name] = len(json.loads((config.get(name) or {}).get("ranks", "")))
            except (TypeError, ValueError):
                sizes[name] = 0
        if sizes[name] > 1:
            e["output_sizes"] = [[sizes[name], *inputs[0]]]
    return entries


_warming: threading.Thread | None = None


def _import_analyzer() -> Any:
    """torch's ``build_db`` (importing it imports torch: seconds on a busy machine)."""
    quiet = logging.getLogger("Flight Recorder")  # torch's analyzer logs to stderr
    was = quiet.disabled
    quiet.disabled = True
    try:
        from torch.distributed.flight_recorder.components.builder import build_db
    finally:
        quiet.disabled = was
    return build_db


def warm_analyzer() -> None:
    """Import torch's analyzer in a daemon thread, once, so that a verdict does not wait for
    torch to load in ddptui's own process (seconds on a loaded machine). Called when a rank
    first stands still: most runs never pay for it."""
    global _warming
    if _warming is not None:
        return

    def load() -> None:
        try:
            _import_analyzer()
        except Exception:  # the verdict's own import says why, in one line
            pass

    _warming = threading.Thread(target=load, name="ddptui-fr-warm", daemon=True)
    _warming.start()


def analyze(traces: Mapping[int, dict], world_size: int) -> Any:
    """torch's ``build_db`` over the ranks' traces (a ``Database`` of collectives, the first
    mismatch recorded with its missing ranks or mismatching ranks). Raises ``ValueError``
    with one line when torch's analyzer cannot read them."""
    docs = {r: d for r, d in traces.items() if d["entries"]}
    if not docs:  # said before torch loads: nothing to analyze
        raise ValueError("no rank recorded a collective")
    build_db = _import_analyzer()
    versions = {d["version"] for d in docs.values()}
    if len(versions) != 1:
        raise ValueError(f"the ranks' recorders differ in version ({sorted(versions)})")
    configs = _pg_configs(docs, world_size)
    details = {
        trace_name(rank): {
            "rank": rank,
            # a copy: torch pops from these lists, and the gathers' sizes are mended in it
            "entries": _gathers_mended(json.loads(json.dumps(doc["entries"])), configs[rank]),
            "version": doc["version"],
            "pg_config": configs[rank],
        }
        for rank, doc in sorted(docs.items())
    }
    args = argparse.Namespace(
        verbose=False,
        just_print_entries=False,
        allow_incomplete_ranks=True,
        mismatch_cap=10,
        selected_ranks=None,
        pg_filters=None,
        print_stack_trace=False,
    )
    quiet = logging.getLogger("Flight Recorder")  # torch's analyzer logs to stderr
    was = quiet.disabled
    quiet.disabled = True
    try:
        return build_db(details, args, versions.pop())
    except (AssertionError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise ValueError(f"torch's Flight Recorder analyzer failed: {exc}") from None
    finally:
        quiet.disabled = was


# -- lines a person can act on ----------------------------------------------------------------
@dataclass(frozen=True)
class Finding:
    """One culprit: the rank, ``hang`` (never entered) or ``desync`` (entered with other
    arguments), the collective (``all_reduce``), its sequence number and group, the line."""

    rank: int
    cause: str
    op: str
    seq: int
    group: str
    detail: str


def _op(profiling_name: str) -> str:
    return profiling_name.rpartition(":")[2].split(" ")[0]


def _numel(sizes: list[list[int]]) -> int:
    return sum(math.prod(s) for s in sizes)


def _values(sizes: list[list[int]], dtypes: list[str]) -> str:
    """``4,420 floats`` (``no data`` for a barrier)."""
    n = _numel(sizes) if sizes else 0
    if not sizes:
        return "no data"
    kinds = sorted(set(dtypes))
    noun = _DTYPE_NOUNS.get(kinds[0], f"{kinds[0]} values") if len(kinds) == 1 else "values"
    if n == 1 and noun.endswith("s"):
        noun = noun[:-1]  # "1 float"
    return f"{n:,} {noun}"


def _user_frame(frames: list[dict]) -> str | None:
    """``train.py:88``: the innermost frame of the user's code in a recorded stack."""
    for f in frames:
        path = f["filename"].replace("\\", "/")
        if is_library(f["filename"]):
            continue
        return f"{path.rsplit('/', 1)[-1]}:{f['line']}"
    return None


def _ddp_part(frames: list[dict]) -> str | None:
    """Which of DDP's collectives a recorded stack issued: ``DDP buffers`` (the broadcast
    before each forward, where a rank waits for a slower peer: facebookresearch/vicreg's
    wait read "DDP bucket"), ``DDP setup`` (the constructor's), ``DDP bucket rebuild`` (the
    order of its buckets, broadcast at the second forward), ``DDP bucket`` (its reducer:
    from autograd's backward, a gradient hook, or DDP otherwise); None: not DDP's."""
    ddp = False
    for i, f in enumerate(frames):
        path = f["filename"].replace("\\", "/")
        if path.endswith(DDP_FILE):
            # innermost: DDP's own C++ issued it (its bucket rebuild)
            part = ddp_purpose([f["name"]]) or (DDP_NATIVE.get(f["name"]) if i == 0 else None)
            if part:
                return part
            ddp = True
        elif "/torch/autograd/" in path and f["name"] in ("_engine_run_backward", "backward"):
            ddp = True
    return "DDP bucket" if ddp else None


def _origin(frames: list[dict]) -> str:
    """What a side's stack says: ``DDP bucket, from train.py:88``."""
    parts = []
    part = _ddp_part(frames)
    if part:
        parts.append(part)
    where = _user_frame(frames)
    if where:
        parts.append(f"from {where}")
    return ", ".join(parts)


def _group(pg_desc: str) -> str:
    """``default_pg`` from torch's ``0:default_pg`` (``group 1`` from ``1:undefined``)."""
    name, _, desc = pg_desc.partition(":")
    return group_label(name, desc) if desc else pg_desc


def _waiting(traces: Mapping[int, dict], ranks: Iterable[int], seq: int) -> tuple[list, list]:
    """Of ``ranks``, those still inside collective ``seq`` (torch's ``pg_status``: entered,
    not completed) and those past it."""
    waits, past = [], []
    for rank in sorted(ranks):
        status = traces.get(rank, {}).get("pg_status") or {}
        done = [
            int(s.get("last_completed_collective", -1))
            for s in status.values()
            if isinstance(s, dict)
            and str(s.get("last_completed_collective", "")).lstrip("-").isdigit()
        ]
        (past if done and max(done) >= seq else waits).append(rank)
    return waits, past


def _last_entry(doc: dict | None, group: str) -> dict | None:
    if not doc:
        return None
    mine = [e for e in doc["entries"] if e["process_group"][0] == group]
    return mine[-1] if mine else None


def findings(
    db: Any, traces: Mapping[int, dict], where: Mapping[int, str] | None = None
) -> list[Finding]:
    """The culprits torch's analyzer found: for its first collective with missing ranks or
    mismatching ranks, one :class:`Finding` per culprit rank. ``where`` (rank -> ``func
    (file:line)``, from the rank's stack) says where a rank that never entered is instead."""
    where = where or {}
    out: list[Finding] = []
    for coll in db.collectives:
        missing = sorted(coll.missing_ranks or ())
        # A state that differs (one rank's NCCL kernel started, another's only scheduled) is
        # timing, not a desync: only another op, shape or dtype is.
        wrong = {
            r: c
            for r, c in (coll.mismatch_collectives or {}).items()
            if _mismatch_kind(c) != "COLLECTIVE_STATE_MISMATCH"
        }
        if not missing and not wrong:
            continue
        op, seq, group = _op(coll.collective_name), coll.collective_seq_id, _group(coll.pg_desc)
        what = f"{op} #{seq}"
        entered = sorted(set(coll.expected_ranks) - set(missing) - set(wrong))
        base_values = _values(coll.input_sizes, _dtypes(traces, entered, coll))
        origin = _origin(coll.collective_frames)
        for rank in missing:
            waits, _past = _waiting(traces, entered, seq)
            verb = "waits" if len(waits) == 1 else "wait"
            who = ranks_text(waits or entered)
            line = f"rank {rank} never entered {what} ({group}, {base_values}"
            line += (
                f"{', ' + origin if origin else ''}) that {who} {verb if waits else 'entered'} in"
            )
            if rank in where:
                line += f"; rank {rank} is in {where[rank]}"
            else:
                last = _last_entry(traces.get(rank), coll.group_id)
                if last is not None:
                    line += f"; rank {rank} last entered {_op(last['profiling_name'])} "
                    line += f"#{last['collective_seq_id']}"
            out.append(Finding(rank, "hang", op, seq, group, line))
        for rank, other in sorted(wrong.items()):
            mine_op = _op(other.collective_name)
            their = f"{op} #{seq}"
            mine_values = _values(other.input_sizes, _entry_dtypes(traces, rank, other))
            mine_origin = _origin(other.collective_frames)
            others = ranks_text(entered) if entered else "the others"
            if mine_op != op:
                line = f"rank {rank} called {mine_op} #{other.collective_seq_id} ({mine_values}"
                line += f"{', ' + mine_origin if mine_origin else ''}) where {others} called "
                line += f"{their} ({base_values}{', ' + origin if origin else ''}): a desync"
            else:
                line = f"rank {rank} called {their} with {mine_values}"
                line += f"{' (' + mine_origin + ')' if mine_origin else ''} where {others} "
                line += f"called it with {base_values}{' (' + origin + ')' if origin else ''}"
                line += ": a desync"
            out.append(Finding(rank, "desync", op, seq, group, line))
        break  # after the first mismatch torch stops pairing: later ones are not evidence
    return out


_NAMED = re.compile(r"\b([a-z_]+ #\d+)")


def collective_named(detail: str) -> str:
    """The first collective a finding's line names (``all_reduce #17``), or ``a collective``."""
    match = _NAMED.search(detail)
    return match.group(1) if match else "a collective"


def _mismatch_kind(coll: Any) -> str | None:
    info = getattr(coll, "type_of_mismatch", None)
    state = getattr(info, "state", None)
    return getattr(state, "name", None)


def _entry_of(traces: Mapping[int, dict], rank: int, coll: Any) -> dict | None:
    """Rank ``rank``'s own entry for the collective (its group, its sequence number)."""
    for e in (traces.get(rank) or {}).get("entries", []):
        if (
            e["process_group"][0] == coll.group_id
            and e["collective_seq_id"] == coll.collective_seq_id
        ):
            return e
    return None


def _entry_dtypes(traces: Mapping[int, dict], rank: int, coll: Any) -> list[str]:
    e = _entry_of(traces, rank, coll)
    return list(e.get("input_dtypes") or []) if e else []


def _dtypes(traces: Mapping[int, dict], ranks: list[int], coll: Any) -> list[str]:
    for rank in ranks:
        found = _entry_dtypes(traces, rank, coll)
        if found:
            return found
    return []


def explain(
    traces: Mapping[int, dict], world_size: int, where: Mapping[int, str] | None = None
) -> tuple[list[Finding], str | None]:
    """Findings from the ranks' traces, and why there are none when the analyzer could not
    run (one line, or None)."""
    try:
        db = analyze(traces, world_size)
    except ValueError as exc:
        return [], str(exc)
    return findings(db, traces, where), None


# -- one call for the session ------------------------------------------------------------------
def collect(
    socket_dir: str | os.PathLike[str],
    run_dir: str | os.PathLike[str],
    ranks: Iterable[int],
    world_size: int,
    t: float,
    stacks: Mapping[int, str] | None = None,
    timeout: float = REQUEST_TIMEOUT_S,
    remote: Iterable[int] = (),
    fetch: Callable[[list[int], float], dict[int, str]] | None = None,
    frames: Mapping[int, str] | None = None,
    stamps: dict[int, Stamp] | None = None,
) -> tuple[list[Any], str]:
    """Ask ``ranks`` for their traces, run torch's analyzer, and return the findings as
    :class:`ddptui.run.diagnosis.Diagnosis` (cause ``hang`` or ``desync``, at ``t`` seconds)
    with one line saying what was read (``Flight Recorder: traces of ranks 0, 1; …``).
    ``stacks`` (rank -> faulthandler dump) says where a rank that never entered is instead;
    ``frames`` (rank -> its heartbeat's frame) where it has no stack. The ranks in ``remote``
    run on other nodes: ``fetch(ranks, timeout)`` brings their traces into ``run_dir`` (their
    node's agent asks them), at the same time as the local ranks are asked. ``stamps`` gets
    the :data:`Stamp` of each trace read (see :func:`at_crash`'s ``asked``)."""
    from ddptui.rank.stacks import whole_dump
    from ddptui.run.diagnosis import Diagnosis, classify_stack

    began = time.monotonic()
    ranks = sorted(set(ranks))
    far = sorted(set(remote) & set(ranks)) if fetch is not None else []
    answers: dict[int, str] = {}
    fetcher = None
    if far:
        assert fetch is not None

        def bring() -> None:
            answers.update(fetch(far, timeout))

        fetcher = threading.Thread(target=bring, name="ddptui-fr-fetch", daemon=True)
        fetcher.start()
    answers.update(request_traces(socket_dir, [r for r in ranks if r not in far], timeout))
    if fetcher is not None:
        fetcher.join(timeout + 1.0)
        answers.update({r: "no answer from its node" for r in far if r not in answers})
    fresh = sorted(r for r, a in answers.items() if a == "ok")
    traces, unreadable = load_traces(run_dir, fresh, stamps)
    where = dict(frames or {})
    where.update(  # a dump cut before its main thread (see whole_dump): the frame instead
        {
            rank: classify_stack(text).where
            for rank, text in (stacks or {}).items()
            if whole_dump(text)
        }
    )
    read = time.monotonic() - began
    found, why = explain(traces, world_size, where) if traces else ([], "no trace")
    note = "Flight Recorder"
    if traces:
        note += f": traces of {ranks_text(traces)} (read in {read:.1f} s, "
        note += f"analyzed in {time.monotonic() - began - read:.1f} s)"
    absent = {r: a for r, a in answers.items() if a != "ok"} | unreadable
    if absent:
        note += "; none from " + "; ".join(f"rank {r} ({a})" for r, a in sorted(absent.items()))
    if why:
        note += f"; {why}"
    elif not found and len(traces) < 2:  # nothing to match against: no claim of a match
        note += "; one trace, nothing to match it against"
    elif not found and absent:
        note += f"; the collectives of {ranks_text(traces)} match"
    elif not found:
        note += "; every collective matches across the ranks"
    return [Diagnosis(f.rank, f.cause, f.detail, t) for f in found], note


def _inside(doc: dict) -> dict | None:
    """The collective a rank's trace says it was inside (started, not completed), or None."""
    status = doc.get("pg_status") or {}
    for entry in reversed(doc["entries"]):
        pg = status.get(str(entry.get("pg_id", entry["process_group"][0]))) or {}
        try:
            completed = int(pg.get("last_completed_collective", -1))
        except (TypeError, ValueError):
            completed = -1
        return entry if entry["collective_seq_id"] > completed else None
    return None


def at_crash(
    run_dir: str | os.PathLike[str],
    pids: Mapping[int, int | None],
    world_size: int,
    t: float,
    failed: Iterable[int] = (),
    errors: Mapping[int, str] | None = None,
    first: tuple[int | None, Iterable[str]] | None = None,
    asked: Mapping[int, Stamp] | None = None,
    tracebacks: Mapping[int, str] | None = None,
) -> list[Any]:
    """After a crash: what the traces the ranks left (a rank writes its own when it fails
    with an exception; one killed outright leaves none) say. torch's analyzer's findings when
    it has any; else, per rank that was inside a collective, a ``collective`` line naming it
    (``rank 0 was in all_reduce #17 (default_pg, 1 float, from train.py:72) when rank 1
    failed; rank 1 left no trace``). A rank whose own error is a collective's (``errors``:
    rank -> its error line; gloo marks a failed collective completed) failed in its last
    collective. Only traces of this attempt's processes (their pid). ``first`` (the rank that
    failed first, its last stderr lines): when gloo aborted it for receiving more bytes than
    its collective expected, a ``desync`` line for the run says so with what the others
    were in (which side erred, gloo does not say). ``asked``: the traces ddptui asked for
    while the run went on (:func:`collect`'s ``stamps``); one not written since is no
    evidence of the crash: a rank killed outright leaves none, and the desync watch's
    trace of its startup read as its last ("rank 1 never joined all_gather #5").
    ``tracebacks``: rank -> its traceback; a rank that failed with an error of its own (not
    a collective's) raised in no ``torch.distributed`` code failed out of any collective,
    whatever gloo's lagging mark still says (facebookresearch/vicreg's rank 1, failed in
    ``torch.load`` after DDP's setup, read "rank 1 was in broadcast #5 … when rank 0
    failed")."""
    from ddptui.run.diagnosis import CONSEQUENCE, Diagnosis

    found, _ = load_traces(run_dir, pids, skip=asked)
    traces = {r: d for r, d in found.items() if pids.get(r) and d.get("pid") == pids[r]}
    aborted = _gloo_mismatch(first)
    if not traces:
        return [Diagnosis(None, "desync", aborted, t)] if aborted else []
    findings_, _why = explain(traces, world_size)
    if findings_:  # after a crash, a rank that never entered is the one that failed: context
        return [
            Diagnosis(f.rank, "desync" if f.cause == "desync" else "context", f.detail, t)
            for f in findings_
        ]
    failed = sorted(set(failed))
    silent = sorted(set(pids) - set(traces))
    out = []
    errors = errors or {}
    tracebacks = tracebacks or {}
    for rank, doc in sorted(traces.items()):
        own_error = not CONSEQUENCE.search(errors.get(rank) or "")
        if rank in failed and own_error and _outside_collectives(tracebacks.get(rank)):
            continue
        entry, verb = _inside(doc), "was in"
        if entry is None and doc["entries"] and not own_error:
            entry, verb = doc["entries"][-1], "failed in"
        if entry is None:
            continue
        line = f"rank {rank} {verb} {_op(entry['profiling_name'])} #{entry['collective_seq_id']}"
        line += f" ({group_label(*entry['process_group'][:2])}, "
        line += _values(entry["input_sizes"], entry["input_dtypes"])
        origin = _origin(entry.get("frames") or [])
        line += f"{', ' + origin if origin else ''})"
        others = [r for r in failed if r != rank]
        if others:
            line += f" when {ranks_text(others)} failed"
        if silent:
            line += f"; {ranks_text(silent)} left no trace"
        out.append(Diagnosis(rank, "context", line, t))
    if aborted:
        seen = "; ".join(d.detail.split(" when ")[0] for d in out)
        out.insert(0, Diagnosis(None, "desync", aborted + (f"; {seen}" if seen else ""), t))
    return out


def _outside_collectives(traceback: str | None) -> bool:
    """Whether a traceback shows frames, none of them in ``torch.distributed``'s code (a
    collective called from Python, DDP's setup checks): the error was raised outside any
    collective."""
    files = traceback_files(traceback or "")
    return bool(files) and not any("/torch/distributed/" in name for name in files)


_GLOO_MISMATCH = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match expected size")


def _gloo_mismatch(first: tuple[int | None, Iterable[str]] | None) -> str | None:
    """``rank 0 aborted: gloo received 2,320 bytes where its collective expected 4, …`` from
    the first failed rank's stderr, or None."""
    if first is None or first[0] is None:
        return None
    for line in first[1]:
        match = _GLOO_MISMATCH.search(line)
        if match:
            got, want = int(match.group(1)), int(match.group(2))
            return (
                f"rank {first[0]} aborted: gloo received {got:,} bytes where its collective "
                f"expected {want:,}, a desync (another op, shape or dtype on a peer, or a "
                "collective left out)"
            )
    return None
