"""The clock a step's time is read on: wall time, or CPU time of the engine's processes.

A GPU engine spends wall time: the device works while the host waits. A CPU
engine spends CPU time, and on a machine shared with other work its wall time
also holds whatever the other processes took from it, in heavy tails. vLLM's
CPU build runs the model in worker processes, children of the engine-core
process where the scheduler runs, so the CPU clock sums the engine core and
its descendants, read through Linux's per-process CPU clocks
(``clock_gettime`` on the clock id of each process: one system call each, no
file reads). The processes are found once, at the first reading, when vLLM
has started its workers; a process that exits stops being read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

# Linux's clock id for a process's CPU time (MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED))
_CPUCLOCK_SCHED = 2


def _process_clock_id(pid: int) -> int:
    return ((~pid) << 3) | _CPUCLOCK_SCHED


def descendants(pid: int) -> list[int]:
    """Processes below ``pid`` in the process tree (one scan of /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    stack = list(children.get(pid, ()))
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, ()))
    return out


class ProcessTreeCPUClock:
    """CPU seconds used by this process and its descendants (vLLM's workers)."""

    def __init__(self) -> None:
        self._clocks: list[int] | None = None

    def __call__(self) -> float:
        clocks = self._clocks
        if clocks is None:
            pids = [os.getpid(), *descendants(os.getpid())]
            clocks = self._clocks = [_process_clock_id(p) for p in pids]
        total = 0.0
        for clock in clocks:
            try:
                total += time.clock_gettime(clock)
            except OSError:  # the process exited: its time no longer moves
                self._clocks = [c for c in clocks if c != clock]
        return total


def make_step_clock(kind: str) -> Callable[[], float]:
    """``wall``: the monotonic clock; ``process_cpu``: :class:`ProcessTreeCPUClock`."""
    if kind == "process_cpu":
        return ProcessTreeCPUClock()
    if kind == "wall":
        return time.monotonic
    raise ValueError(f"unknown step clock {kind!r}")
