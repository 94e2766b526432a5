"""Engine CPU time, read from ``/proc``: the CPU seconds of the vLLM server's descendants.

The descendants are vLLM's engine core and its model workers; the API
server's own process (HTTP, tokenizing) is excluded. On a CPU engine that is
the engine's cost, and unlike wall time it barely moves when other processes
load the machine.
"""

from __future__ import annotations

import os


def _stat(pid: int) -> tuple[int, float]:
    """(parent pid, CPU seconds) of a process, from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ProcessTree:
    """CPU seconds of a process's descendants, the process itself excluded.

    :meth:`refresh` walks ``/proc`` to find the descendants (and which of them are
    vLLM's model workers, by process title); :meth:`cpu_seconds` then reads only their
    ``stat`` files, so a reading is quick and does not touch other processes (reading
    another process's command line can wait on its memory map lock).
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self.pids: dict[int, bool] = {}  # descendant -> is a model worker

    def refresh(self) -> None:
        parent: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    parent[int(entry)] = _stat(int(entry))[0]
                except (OSError, IndexError, ValueError):
                    continue
        found: dict[int, bool] = {}
        for pid in parent:
            p = parent.get(pid, 1)
            while p > 1 and p != self.root:
                p = parent.get(p, 1)
            if p == self.root:
                if pid in self.pids:
                    found[pid] = self.pids[pid]
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        # vLLM's process title for its model worker
                        found[pid] = f.read(64).startswith(b"VLLM::Worker")
                except OSError:
                    continue
        self.pids = found

    def cpu_seconds(self) -> tuple[float, float]:
        """(all descendants, the model workers alone). vLLM's CPU engine core busy-waits
        for its worker's result, so the first counts that waiting as well; the workers'
        time is the forward passes, drafting and sampling."""
        total = in_worker = 0.0
        for pid, is_worker in list(self.pids.items()):
            try:
                seconds = _stat(pid)[1]
            except (OSError, IndexError, ValueError):
                continue  # gone: its time is no longer counted by anyone
            total += seconds
            if is_worker:
                in_worker += seconds
        return total, in_worker


def engine_cpu_seconds(root: int) -> tuple[float, float]:
    """CPU seconds so far of ``root``'s descendants, ``root`` itself excluded: (all of them,
    vLLM's model workers alone)."""
    tree = ProcessTree(root)
    tree.refresh()
    return tree.cpu_seconds()
