"""A garbled environment never crashes a training script through telemetry."""

import os
import subprocess
import sys

import pytest

SCRIPT = (
    "import ddptui; ddptui.log(loss=1.0, samples=2); ddptui.log_eval(accuracy=0.5); print('ok')"
)


@pytest.mark.parametrize(
    "env, warning",
    [
        ({"DDPTUI_ENDPOINT": "garbage"}, "telemetry off: cannot use DDPTUI_ENDPOINT 'garbage'"),
        ({"DDPTUI_ENDPOINT": "tcp://999.1.1.1:99999"}, None),
        ({"DDPTUI_ENDPOINT": "ipc:///nonexistent/dir/sock"}, None),
        ({"DDPTUI_ENDPOINT": "ipc:///nonexistent/x", "RANK": "abc"}, None),
        ({"DDPTUI_ENDPOINT": "ipc:///nonexistent/x", "WORLD_SIZE": "zz", "LOCAL_RANK": "-1"}, None),
        ({"DDPTUI_ENDPOINT": "ipc:///nonexistent/x", "RANK": "99999999999999999999"}, None),
    ],
)
def test_bad_environment_leaves_the_script_running(env, warning):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DDPTUI_")}
    clean.pop("RANK", None)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert "Traceback" not in out.stderr
    if warning:
        assert warning in out.stderr and out.stderr.count("\n") == 1
