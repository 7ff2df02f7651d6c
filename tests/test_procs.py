"""Worker processes die with their parent (``prefixlab.procs``).

A parent killed with SIGKILL cannot stop its pool: the workers must end by themselves, and
with them multiprocessing's resource tracker (which stays while any of them holds its pipe).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")

PARENT = """
import os, sys, time
from prefixlab.procs import process_pool

def pid(_):
    return os.getpid()

if __name__ == "__main__":
    pool = process_pool(2)
    pids = set(pool.map(pid, range(8)))
    print(" ".join(map(str, sorted(pids))), flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as dead)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = next(line for line in status.splitlines() if line.startswith("State:"))
    return "Z" not in state.split()[1]


def _children(pid: int) -> set[int]:
    kids: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        kids.update(int(k) for k in text)
    return kids


def test_pool_workers_and_the_resource_tracker_die_with_a_killed_parent(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        workers = {int(p) for p in proc.stdout.readline().split()}
        assert workers and all(_alive(p) for p in workers)
        everyone = _children(proc.pid)  # the workers and the resource tracker
        assert workers <= everyone
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in everyone) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in everyone if _alive(p)], "left running after the parent died"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_worker_started_after_its_parent_died_ends_at_once() -> None:
    """The race the kernel call cannot cover: the parent gone before the request."""
    code = (
        "import os; from prefixlab.procs import die_with_parent; "
        "die_with_parent(os.getppid() + 1); print('survived')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "survived" not in out.stdout
