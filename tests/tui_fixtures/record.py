"""How the recorded runs under ``runs/`` were made (re-run to refresh them).

1. Record real runs headless, e.g.::

       uv run ddptui --no-ui --script tests/scripts/user_ddp.py --run-dir /tmp/rec/ok \\
           -- --steps 40 --sleep 0.02
       uv run ddptui --no-ui --script tests/scripts/user_ddp.py --run-dir /tmp/rec/fail \\
           -- --steps 20 --fail-rank 1 --sleep 0.02
       uv run ddptui --no-ui --trainer synthetic --epochs 3 --backend gloo \\
           --run-dir /tmp/rec/syn -- --train-size 1600 --test-size 400

2. Sanitize them into this folder (fixed run ids, pids, host name and paths, so snapshots do
   not depend on the machine that recorded them)::

       uv run python -m tests.tui_fixtures.record /tmp/rec/ok rec-ok
       uv run python -m tests.tui_fixtures.record /tmp/rec/fail rec-fail
       uv run python -m tests.tui_fixtures.record /tmp/rec/syn rec-mid --cut 0.55 --gpus

``--cut F`` keeps the first fraction F of the events (a run caught mid-way); ``--gpus`` moves
the ranks onto the fake GPUs of :mod:`tests.tui_fixtures.fakes` (device ``cuda:N`` and their
UUIDs), so the system panel shows which rank runs on which GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from tests.tui_fixtures.fakes import RANK_PIDS, RUNS, UUID_0, UUID_1

HOST = "node-a"
ROOT = str(Path(__file__).resolve().parents[2]) + "/"


def sanitize(src: Path, name: str, cut: float | None = None, gpus: bool = False) -> Path:
    dest = RUNS / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    config = json.loads((src / "config.json").read_text())
    old_id = config["run_id"]
    pids: dict[int, int] = {}
    lines = [
        json.loads(line) for line in (src / "events.jsonl").read_text().splitlines() if line.strip()
    ]
    if cut is not None:
        lines = lines[: max(1, int(len(lines) * cut))]
    for event in lines:
        event["run"] = name
        if event.get("pid"):
            pids[event["pid"]] = RANK_PIDS[event["rank"] % len(RANK_PIDS)] + 10 * (
                event["rank"] // len(RANK_PIDS)
            )
            event["pid"] = pids[event["pid"]]
        if event.get("host"):
            event["host"] = HOST
        if gpus and event["kind"] == "status" and event["state"] == "started":
            event["device"] = f"cuda:{event['rank']}"
            event["device_uuid"] = (UUID_0, UUID_1)[event["rank"] % 2]
    (dest / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    config["run_id"] = name
    config["run_dir"] = f"runs/{name}"
    if config.get("script"):
        config["script"] = config["script"].replace(ROOT, "")
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    def clean(text: str) -> str:
        text = text.replace(ROOT, "").replace(old_id, name)
        for old, new in pids.items():
            text = re.sub(rf"\b{old}\b", str(new), text)
        return text

    for log in src.glob("rank-*.log"):
        text = clean(log.read_text())
        if cut is not None:  # a run caught mid-way has not printed its last lines yet
            text = "\n".join(text.splitlines()[: int(len(text.splitlines()) * cut)]) + "\n"
        (dest / log.name).write_text(text)
    result = src / "launcher-result.json"
    if result.exists() and cut is None:
        (dest / result.name).write_text(clean(result.read_text()))
    return dest


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("name")
    parser.add_argument("--cut", type=float)
    parser.add_argument("--gpus", action="store_true")
    args = parser.parse_args()
    print(sanitize(args.src, args.name, args.cut, args.gpus))
