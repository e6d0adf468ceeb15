"""``ddptui join TOKEN``: one node of a multi-node run.

It asks node 0 (authenticated with the token's CURVE keys) for the run's configuration and a
node slot, starts this node's ranks under torchrun (c10d rendezvous), relays their telemetry
to node 0 over one CURVE channel, and follows the run: when node 0 says the run has ended
(a rank failed elsewhere, the user stopped it), it tears its node down. It exits with the
run's outcome (0 finished, 1 failed, 128+N after signal N); a token that is wrong, a node that
comes late or twice, gets one line and exit 2 before anything starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import stat
import sys
from pathlib import Path
from typing import Any

from ddptui import safeio
from ddptui.commands import fail
from ddptui.constants import JOIN_TOKEN_ENV
from ddptui.join.agent import NodeAgent
from ddptui.join.channel import Channel
from ddptui.run.check_target import check_module, check_script
from ddptui.run.cluster.token import MAX_TOKEN_CHARS, TOKEN_PREFIX, JoinToken, TokenError
from ddptui.run.options import (
    ConfigError,
    RunConfig,
    parse_int,
    parse_local_rank_arg,
    parse_path,
)
from ddptui.runfiles import RunDir

DESCRIPTION = (
    "Join a multi-node run as one more node: run the 'ddptui join …' line that the first "
    "node printed."
)
#: How long to wait for node 0's answer to the join request.
JOIN_TIMEOUT_S = 15.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "token",
        nargs="?",
        metavar="TOKEN",
        help="the join token, or node 0's run directory where it is shared (its join-token "
        f"file; default: ${JOIN_TOKEN_ENV})",
    )
    p.add_argument("--node-rank", metavar="K", help="this node's slot (default: the next free)")
    p.add_argument(
        "--run-dir", metavar="DIR", help="this node's logs (default runs/<run-id>-node<K>)"
    )
    p.add_argument(
        "--timeout", metavar="S", default=str(int(JOIN_TIMEOUT_S)), help="wait for node 0 (seconds)"
    )
    p.add_argument("--slurm", action="store_true", help=argparse.SUPPRESS)


def config_from_node0(data: Any, run_dir: str) -> RunConfig:
    """The run's configuration as node 0 sent it, checked field by field (node 0 is
    authenticated, but a mismatch of versions must not become a traceback)."""
    if not isinstance(data, dict):
        raise ConfigError("config", "node 0 sent no configuration")
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    values: dict[str, Any] = {}
    defaults = RunConfig()
    for name, value in data.items():
        if name not in fields:
            continue  # a newer node 0: fields this node does not know
        default = getattr(defaults, name)
        if name == "script_args":
            if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
                raise ConfigError("config", "node 0 sent malformed script arguments")
            value = tuple(value)
        elif value is not None and default is not None and not isinstance(value, type(default)):
            if not (isinstance(default, float) and isinstance(value, int)):
                raise ConfigError("config", f"node 0 sent a malformed {name!r}")
        values[name] = value
    cfg = dataclasses.replace(defaults, **values)
    if not cfg.run_id or not cfg.rdzv_endpoint or cfg.nnodes < 1 or cfg.world_size < cfg.nnodes:
        raise ConfigError("config", "node 0 sent an incomplete multi-node configuration")
    if cfg.local_rank_arg is not None:  # into each rank's environment: a str, and a flag
        cfg = dataclasses.replace(cfg, local_rank_arg=parse_local_rank_arg(cfg.local_rank_arg))
    if cfg.script_module:  # found again here, as python -m on this node finds it
        if not isinstance(cfg.script_module, str):
            raise ConfigError("config", "node 0 sent a malformed 'script_module'")
        _, script = check_module(cfg.script_module)
        cfg = dataclasses.replace(cfg, script=script)
    elif cfg.script:
        check_script(cfg.script)  # the same path on every node (a shared file system)
    return dataclasses.replace(cfg, run_dir=run_dir)


def token_text(given: str) -> str:
    """The token itself, or read from node 0's run directory (its ``join-token`` file, which
    node 0 writes while the run lasts) or from that file named: on a shared file system the
    short ``ddptui join RUN_DIR`` replaces a line too long to copy off a dashboard.
    Raises :class:`TokenError` (one line)."""
    if given.strip().startswith(TOKEN_PREFIX):
        return given
    path = Path(given).expanduser()
    if safeio.is_dir(path):
        path = RunDir(path).join_token
    elif not os.path.lexists(path):
        raise TokenError("not a ddptui join token (copy the whole 'ddptui join' line)")
    try:
        with safeio.open_regular(path, MAX_TOKEN_CHARS + 1) as f:
            st = os.fstat(f.fileno())
            # Yours and private, as ssh wants a key: in a directory others may write, a token
            # put there by someone else would point this node at their "node 0", which sends
            # the script to run.
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise TokenError(
                    f"{safeio.shown(path)}: refused, a join token file must be yours and "
                    f"private (mode 0600; it is {stat.S_IMODE(st.st_mode):o}, owner uid "
                    f"{st.st_uid})"
                )
            return f.read(MAX_TOKEN_CHARS + 1).decode("utf-8", "replace")
    except FileNotFoundError:
        raise TokenError(
            f"{safeio.shown(path)}: no join token there (the run has ended, or this is not "
            "node 0's run directory of a multi-node run)"
        ) from None
    except OSError as exc:
        raise TokenError(f"cannot read {safeio.shown(path)}: {safeio.why(exc)}") from None


def run(args: argparse.Namespace) -> int:
    text = args.token or os.environ.get(JOIN_TOKEN_ENV, "")
    if not text:
        return fail(f"give the join token (or set ${JOIN_TOKEN_ENV})")
    try:
        token = JoinToken.decode(token_text(text))
        timeout = parse_int("timeout", args.timeout, 1, 3600)
        node = None if args.node_rank is None else parse_int("node_rank", args.node_rank, 0)
        if args.slurm:
            node_id = os.environ.get("SLURM_NODEID", "")
            if not node_id.isdigit():
                return fail("join --slurm runs under srun (SLURM_NODEID is not set)")
            node = int(node_id)
    except (TokenError, ConfigError) as exc:
        return fail(str(exc))
    host = socket.gethostname()
    channel = Channel(token)
    try:
        reply = channel.ask({"op": "join", "v": 1, "node": node, "host": host}, timeout)
        if reply is None:
            return fail(
                f"node 0 at {token.endpoint} did not answer within {timeout} s: a wrong token "
                "(from another run), the run has ended, or the address is not reachable"
            )
        if not reply.get("ok"):
            return fail(f"node 0 refused this node: {str(reply.get('error'))[:300]}")
        slot = reply.get("node")
        telemetry = reply.get("telemetry")
        if not isinstance(slot, int) or not isinstance(telemetry, str):
            return fail("node 0 sent a malformed answer")
        try:
            run_id = str((reply.get("config") or {}).get("run_id", ""))
            if (
                not run_id
                or len(run_id) > 128
                or not all(c.isalnum() or c in "._-" for c in run_id)
            ):
                return fail("node 0 sent a malformed run id")
            if args.slurm:  # node 0's run directory (a shared file system): one per node
                run_dir = parse_path("run_dir", args.run_dir or "runs") / f"node{slot}"
            elif args.run_dir:
                run_dir = parse_path("run_dir", args.run_dir)
            else:
                run_dir = Path("runs") / f"{run_id}-node{slot}"
            cfg = config_from_node0(reply.get("config"), str(run_dir.resolve()))
        except ConfigError as exc:
            return fail(str(exc))
        agent = NodeAgent(cfg, slot, channel, telemetry, host, is_host=args.slurm and slot == 0)
        return agent.run(sys.stdout)
    finally:
        channel.close()
