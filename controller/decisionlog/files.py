"""Decision-log files on disk: their names, which segments each covers, and durable writes.

A log directory holds ``decisions-<first>-<last>.parquet`` files, zero-padded
segment numbers, ``first == last`` for a single flushed segment. A merged file
is named after the range of segments it holds, so a file *covers* every other
file whose range lies inside its own: readers skip covered files, and the
writer deletes them on start (a crash between a merge and its deletes leaves
both). Files last written before an instant cannot hold a step that ended
after it, which is how a restart finds the log's tail without reading it all.

Writes are durable and atomic: a temporary ``.<name>.tmp`` in the same
directory, fsync, rename over the final name, fsync of the directory, so a
file under its final name is always whole. The sidecar's snapshots and the
engine's traces publish their files the same way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

FILE_RE = re.compile(r"^decisions-(?P<first>[0-9]{10})-(?P<last>[0-9]{10})\.parquet$")
TMP_SUFFIX = ".tmp"
# A file last written this long before an instant cannot hold a step that ended after it.
MTIME_MARGIN_S = 5.0


def file_name(first: int, last: int) -> str:
    return f"decisions-{first:010d}-{last:010d}.parquet"


@dataclass(frozen=True)
class LogFile:
    """A decision-log file and the segments it holds."""

    first: int
    last: int
    path: Path

    def covers(self, other: LogFile) -> bool:
        """Whether this file holds every segment of ``other`` (and is not it)."""
        return (
            self.first <= other.first
            and other.last <= self.last
            and (self.first, self.last) != (other.first, other.last)
        )


def log_files_in(directory: Path) -> list[LogFile]:
    """Every file of ``directory`` with a log name, oldest first, covered or not."""
    found = []
    for entry in directory.iterdir():
        m = FILE_RE.match(entry.name)
        if m:
            found.append(LogFile(int(m.group("first")), int(m.group("last")), entry))
    return sorted(found, key=lambda f: (f.first, f.last, f.path))


def split_covered(files: Iterable[LogFile]) -> tuple[list[LogFile], list[LogFile]]:
    """(files no other file covers, files another covers), each in the given order."""
    files = list(files)
    live: list[LogFile] = []
    covered: list[LogFile] = []
    for f in files:
        (covered if any(g.covers(f) for g in files) else live).append(f)
    return live, covered


def log_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand directories into the files to read, oldest first, skipping covered ones;
    keep explicit files as given."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            live, _ = split_covered(log_files_in(p))
            out += [f.path for f in live]
        else:
            out.append(p)
    return out


def log_files_since(directory: Path, since_unix_s: float | None) -> list[Path]:
    """The files of ``directory`` that may hold a step that ended after ``since_unix_s``
    (all of them for None), oldest first."""
    files = log_files([directory])
    if since_unix_s is None:
        return files
    out = []
    for f in files:
        try:
            if f.stat().st_mtime >= since_unix_s - MTIME_MARGIN_S:
                out.append(f)
        except OSError:
            continue
    return out


def temporary_path(path: Path) -> Path:
    """Where ``path`` is written before it is published under its name."""
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


def fsync_path(path: Path) -> None:
    """fsync a file or a directory by name."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, path: Path) -> None:
    """Give the complete file ``tmp`` the name ``path`` durably: fsync, rename, fsync dir."""
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(path.parent)


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> int:
    """Write ``path`` with ``write(file)`` so that it is either its previous self (or
    absent) or complete; return its size in bytes."""
    tmp = temporary_path(path)
    with open(tmp, "wb") as f:
        write(f)
    publish(tmp, path)
    return path.stat().st_size


def write_table(table: pa.Table, path: Path, compression: str = "zstd") -> int:
    """Write ``table`` as a Parquet file, atomically; return its size in bytes."""
    return write_atomically(path, lambda f: pq.write_table(table, f, compression=compression))
