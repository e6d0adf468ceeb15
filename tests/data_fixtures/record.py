"""How the recorded runs under ``runs/`` were made (re-run to refresh them).

Two finished runs of the synthetic trainer that differ only in ``--amp``::

    ddptui --no-ui --trainer synthetic --epochs 3 --backend gloo --amp off \\
        --run-dir /tmp/rec/off -- --train-size 1600 --test-size 400
    ddptui --no-ui --trainer synthetic --epochs 3 --backend gloo --amp bf16 \\
        --run-dir /tmp/rec/bf16 -- --train-size 1600 --test-size 400
    python -m tests.data_fixtures.record /tmp/rec/off amp-off
    python -m tests.data_fixtures.record /tmp/rec/bf16 amp-bf16

The events, config and logs are sanitized like the dashboard's recordings
(:mod:`tests.tui_fixtures.record`: fixed run ids, pids, host and paths); ``summary.json`` too.
They live apart from ``tests/tui_fixtures/runs`` because the launch screen's snapshots list
every run there.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from tests.tui_fixtures import record

RUNS = Path(__file__).resolve().parent / "runs"


def sanitize(src: Path, name: str) -> Path:
    tmp = record.sanitize(src, f"tmp-{name}")  # written under the dashboard's fixtures
    dest = RUNS / name
    if dest.exists():
        shutil.rmtree(dest)
    RUNS.mkdir(exist_ok=True)
    shutil.move(tmp, dest)
    for path in dest.iterdir():  # the temporary name leaked into the files
        if path.is_file():
            path.write_text(path.read_text().replace(f"tmp-{name}", name))
    pids = {}
    for line in (dest / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("pid"):
            pids[event["rank"]] = event["pid"]
    summary = json.loads((src / "summary.json").read_text())
    summary["run_id"] = name
    for rank in summary.get("ranks", []):
        rank["host"] = record.HOST
        rank["pid"] = pids.get(rank["rank"], rank["pid"])
    (dest / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return dest


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("name")
    args = parser.parse_args()
    print(sanitize(args.src, args.name))
