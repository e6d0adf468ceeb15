"""The rank's heartbeat: where the main thread is, a digest that changes when its stack moves,
and CPU time that counts the rank's DataLoader workers (a rank waiting for busy workers is not
idle)."""

import subprocess
import sys
import threading
import time

from ddptui.rank import heartbeat


def test_the_main_frame_and_digest_follow_the_main_thread():
    seen = []
    done = threading.Event()

    def sample():
        seen.append(heartbeat.main_frames())
        done.set()

    threading.Thread(target=sample).start()
    done.wait(5)
    frames = seen[0]
    funcs = [f.func for f in frames]  # innermost first: threading's wait, then this test
    assert funcs[0] == "wait" and "test_the_main_frame_and_digest_follow_the_main_thread" in funcs
    assert heartbeat.digest(frames) == heartbeat.digest(list(frames))
    assert heartbeat.digest(frames) != heartbeat.digest(frames[1:])


def test_cpu_counts_busy_children():
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"]
    )
    try:
        deadline = time.monotonic() + 10
        while heartbeat._children_cpu(heartbeat.os.getpid()) < 0.3:
            assert time.monotonic() < deadline, "the child's CPU was never counted"
            time.sleep(0.1)
        assert heartbeat.process_cpu() >= time.process_time() + 0.25
    finally:
        child.kill()
        child.wait()
