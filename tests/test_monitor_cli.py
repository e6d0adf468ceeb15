"""``ddptui monitor`` (headless): table and JSON output, count, Ctrl-C, no textual."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import textwrap

import pytest

from ddptui.monitor import cli
from ddptui.monitor.cli import main, run_monitor_headless
from ddptui.monitor.snapshot import SNAPSHOT_SCHEMA_VERSION
from tests.fake_nvml import FakeGpu, FakeNvml, GiB

GPUS = [
    FakeGpu(
        name="NVIDIA H100 80GB HBM3",
        util_gpu=97,
        memory_used=70 * GiB,
        temperature=61,
        power_mw=312_000,
        processes={1234: 10 * GiB},
    ),
    FakeGpu(
        name="Tesla T4",
        uuid="GPU-2",
        unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetComputeRunningProcesses"},
    ),
]


def run(**kwargs) -> tuple[int, str]:
    out = io.StringIO()
    code = run_monitor_headless(interval=0.1, out=out, **kwargs)
    return code, out.getvalue()


def test_json_lines_have_stable_keys():
    nvml = FakeNvml(GPUS)
    code, text = run(count=2, as_json=True, nvml_module=nvml)
    assert code == 0
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) == 2
    for obj in lines:
        assert list(obj) == ["v", "time", "gpu", "host", "processes"]
        assert obj["gpu"]["available"] is True and obj["gpu"]["reason"] is None
        g0, g1 = obj["gpu"]["devices"]
        assert g0["utilization_gpu"] == 97 and g0["processes"] == [
            {"pid": 1234, "used_memory": 10 * GiB}
        ]
        assert g1["power_draw"] is None and g1["processes"] is None
        assert obj["host"]["memory_total"] > 0
    assert lines[0].keys() == lines[1].keys()
    assert nvml.initialized == 0  # NVML shut down when the command ends


def test_table_lists_gpus_then_cpu_and_ram():
    code, text = run(count=1, nvml_module=FakeNvml(GPUS))
    assert code == 0
    lines = text.splitlines()
    assert "driver 550.54.15" in lines[0]
    assert lines[1].split() == ["GPU", "NAME", "UTIL", "MEM", "TEMP", "POWER", "PROCESSES"]
    assert lines[2].split()[:4] == ["0", "H100", "80GB", "HBM3"]
    assert "97%" in lines[2] and "70.0 / 80.0 GiB" in lines[2] and "61C" in lines[2]
    assert "312 / 700W" in lines[2] and "1234(10.0 GiB)" in lines[2]
    assert "Tesla T4" in lines[3] and "N/A / 700W" in lines[3] and lines[3].endswith("N/A")
    assert lines[4].startswith("CPU ") and "cores" in lines[4]
    assert lines[5].startswith("RAM ") and "swap" in lines[5]


def test_table_without_gpu_says_why():
    nvml = FakeNvml(init_error=FakeNvml.NVMLError_DriverNotLoaded)
    code, text = run(count=1, nvml_module=nvml)
    assert code == 0
    assert text.splitlines()[1] == "GPU  no NVIDIA GPU: Driver Not Loaded"


def test_ctrl_c_exits_cleanly(monkeypatch):
    """Ctrl-C after the first sample: a flag the monitor's waits see (no KeyboardInterrupt
    that could leave a lock held), one line out, NVML shut down, Python's handler back."""
    import signal

    monkeypatch.setattr(cli.time, "sleep", lambda seconds: None)
    original = cli.SystemMonitor.sample

    def sample_then_ctrl_c(self, *args, **kwargs):
        snapshot = original(self, *args, **kwargs)
        signal.raise_signal(signal.SIGINT)
        return snapshot

    monkeypatch.setattr(cli.SystemMonitor, "sample", sample_then_ctrl_c)
    before = signal.getsignal(signal.SIGINT)
    nvml = FakeNvml(GPUS)
    code, text = run(count=None, as_json=True, nvml_module=nvml)
    assert code == 0
    assert len(text.splitlines()) == 1
    assert nvml.initialized == 0
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"interval": 0.05}, "at least 0.1 s"), ({"count": 0}, "count must be at least 1")],
)
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_monitor_headless(**{"interval": 0.1, **kwargs}, nvml_module=FakeNvml())


@pytest.mark.parametrize(
    "argv",
    [
        ["--interval", "0.01"],
        ["--count", "0"],
        ["--interval", "x"],
        ["--interval", "inf"],
        ["--interval", "1e308"],
        ["--interval", "nan"],
        ["--count", "99999999999999999999"],
    ],
)
def test_main_rejects_bad_arguments_in_one_line(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddptui: error: argument --") and err.count("\n") == 1


def test_module_prints_json_lines_on_this_machine():
    """The acceptance command: real NVML (or its absence), real psutil, exit code 0."""
    result = subprocess.run(
        [sys.executable, "-m", "ddptui.monitor.cli", "--json", "--count", "3", "--interval", "0.2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 3
    for obj in lines:
        host = obj["host"]
        assert host["cpu_percent"] is not None and 0 <= host["cpu_percent"] <= 100
        assert len(host["cpu_percent_per_core"]) == host["cpu_count"]
        assert 0 < host["memory_used"] <= host["memory_total"]
        gpu = obj["gpu"]
        if gpu["available"]:  # a machine with a GPU
            assert gpu["devices"]
        else:
            assert gpu["reason"] and gpu["devices"] == []


def test_sigint_exits_with_zero_and_no_traceback():
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddptui.monitor.cli", "--json", "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert json.loads(proc.stdout.readline())["v"] == SNAPSHOT_SCHEMA_VERSION  # sampling
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and err == ""


def test_monitor_path_never_imports_textual_or_torch():
    code = textwrap.dedent("""
        import io, sys
        from ddptui.monitor.cli import run_monitor_headless
        import ddptui.monitor
        run_monitor_headless(interval=0.1, count=1, as_json=True, out=io.StringIO())
        run_monitor_headless(interval=0.1, count=1, out=io.StringIO())
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("textual", "torch"))
        print(bad)
        sys.exit(1 if bad else 0)
    """)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_broken_pipe_is_quiet():
    class ClosedPipe(io.StringIO):
        def write(self, text):
            raise BrokenPipeError

    assert (
        run_monitor_headless(interval=0.1, count=5, out=ClosedPipe(), nvml_module=FakeNvml()) == 0
    )
