"""Read decision logs back, checking every file and row, naming what is wrong.

A path is a log directory (its ``decisions-*.parquet`` files, skipping
segments a merged file already covers, and ignoring ``*.tmp`` leftovers) or a
single Parquet file. Bad input (a corrupt or truncated file, an unknown schema
version, a propensity outside (0, 1], accepted above drafted, ...) is a
:class:`LogProblem` naming the file and the row: with ``on_bad_input="fail"``
the first one raises :class:`LogInputError`, with ``"skip"`` the bad file or
rows are left out and every problem is returned, never silently. A file of an
older schema version reads as the current one, the columns added since holding
what they hold when nothing was reported
(:func:`specctl.decisionlog.schema.with_absent_columns`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from specctl.arms import ArmError, parse_arm
from specctl.decisionlog.files import log_files
from specctl.decisionlog.schema import (
    NO_BATCH_DRAFTER,
    SCHEMA,
    SUPPORTED_VERSIONS,
    VERSION_KEY,
    columns_of_version,
    with_absent_columns,
)

OnBadInput = Literal["fail", "skip"]


@dataclass(frozen=True)
class LogProblem:
    """Something wrong in a log: ``row`` is the first bad row (None for the whole file)."""

    path: str
    row: int | None
    reason: str
    message: str
    rows: int = 0  # how many rows share the problem (0: the whole file)

    def __str__(self) -> str:
        where = self.path if self.row is None else f"{self.path} row {self.row}"
        more = f" ({self.rows} rows)" if self.rows > 1 else ""
        return f"{where}: {self.message}{more}"


class LogInputError(ValueError):
    """Bad input met with ``on_bad_input="fail"``."""

    def __init__(self, problem: LogProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


@dataclass
class DecisionLog:
    """The rows that passed every check, in file order, and what was left out."""

    table: pa.Table
    files: list[Path] = field(default_factory=list)
    problems: list[LogProblem] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows)


def _file_problem(path: Path) -> tuple[pa.Table | None, LogProblem | None]:
    name = str(path)
    try:
        pf = pq.ParquetFile(path)
        metadata = pf.schema_arrow.metadata or {}
    except FileNotFoundError:
        return None, LogProblem(name, None, "missing", "no such file")
    except (OSError, pa.ArrowException) as exc:
        return None, LogProblem(
            name, None, "corrupt", f"not a readable Parquet file (truncated or corrupt): {exc}"
        )
    version = metadata.get(VERSION_KEY)
    if version is None:
        return None, LogProblem(
            name,
            None,
            "schema_version",
            "no specctl schema version in its metadata: not a decision log",
        )
    try:
        v = int(version)
    except ValueError:
        v = -1
    if v not in SUPPORTED_VERSIONS:
        return None, LogProblem(
            name,
            None,
            "schema_version",
            f"decision log schema version {version.decode(errors='replace')!r} is not supported "
            f"(this specctl reads {sorted(SUPPORTED_VERSIONS)})",
        )
    names = columns_of_version(v)
    missing = [n for n in names if n not in pf.schema_arrow.names]
    if missing:
        return None, LogProblem(name, None, "columns", f"missing columns {missing}")
    try:
        table = pf.read(columns=names)
        table = table.cast(pa.schema([SCHEMA.field(n) for n in names], metadata=SCHEMA.metadata))
        table = with_absent_columns(table)  # an older version's: what was not reported
    except (OSError, pa.ArrowException) as exc:
        return None, LogProblem(
            name, None, "corrupt", f"cannot be read (truncated or corrupt): {exc}"
        )
    if table.num_rows and any(table.column(n).null_count for n in SCHEMA.names):
        col = next(n for n in SCHEMA.names if table.column(n).null_count)
        row = int(np.flatnonzero(table.column(col).is_null().to_numpy(zero_copy_only=False))[0])
        return None, LogProblem(name, row, "null", f"{col} is null", table.column(col).null_count)
    return table, None


def _row_problems(path: Path, table: pa.Table) -> tuple[np.ndarray, list[LogProblem]]:
    """Rows that break the log's rules: a mask of bad rows and one problem per rule."""
    name = str(path)
    n = table.num_rows
    bad = np.zeros(n, dtype=bool)
    problems: list[LogProblem] = []

    def check(mask: np.ndarray, reason: str, describe: Callable[[int], str]) -> None:
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            problems.append(LogProblem(name, i, reason, describe(i), int(mask.sum())))
            bad[mask] = True

    def col(name_: str) -> np.ndarray:
        return table.column(name_).to_numpy()

    prop = col("propensity")
    check(
        ~np.isfinite(prop) | (prop <= 0.0) | (prop > 1.0),
        "propensity",
        lambda i: f"propensity={float(prop[i])!r} outside (0, 1]",
    )
    drafted, accepted = col("drafted"), col("accepted")
    check(
        (drafted < 0) | (accepted < 0),
        "negative",
        lambda i: f"drafted={drafted[i]} or accepted={accepted[i]} is negative",
    )
    check(
        accepted > drafted,
        "accepted",
        lambda i: f"accepted={accepted[i]} exceeds drafted={drafted[i]}",
    )
    st = col("step_time_s")
    check(
        ~np.isfinite(st) | (st <= 0.0),
        "step_time",
        lambda i: f"step_time_s={float(st[i])!r} is not a positive number",
    )
    nreq = col("num_requests")
    check(nreq < 1, "num_requests", lambda i: f"num_requests={nreq[i]} is below 1")
    lb = col("load_bucket")
    check(lb < 0, "load_bucket", lambda i: f"load_bucket={lb[i]} is negative")

    draft_k = col("draft_k")
    check(
        draft_k < -1,
        "draft_k",
        lambda i: f"draft_k={draft_k[i]} is below -1 (not reported)",
    )
    drafter_col = table.column("batch_drafter").combine_chunks()
    if n:
        no_drafter = np.array(
            [d == NO_BATCH_DRAFTER for d in drafter_col.dictionary.to_pylist()], dtype=bool
        )
        check(
            (draft_k >= 0) & no_drafter[drafter_col.indices.to_numpy()],
            "draft_k",
            lambda i: f"draft_k={draft_k[i]} names no batch_drafter",
        )

    arm_col = table.column("arm").combine_chunks()
    if n:
        arm_names = arm_col.dictionary.to_pylist()
        k_of: list[int] = []
        for arm_name in arm_names:
            try:
                k_of.append(parse_arm(arm_name).k)
            except ArmError:
                k_of.append(-1)
        codes = arm_col.indices.to_numpy()
        arm_k = np.asarray(k_of, dtype=np.int64)[codes]
        check(
            arm_k < 0,
            "arm",
            lambda i: f"arm {arm_names[codes[i]]!r} is neither 'off' nor '<drafter>/k=<K>'",
        )
        check(
            (arm_k >= 0) & (drafted > arm_k),
            "drafted",
            lambda i: f"drafted={drafted[i]} exceeds the K of its arm {arm_names[codes[i]]!r}",
        )
    return bad, problems


def read_decision_log(
    paths: Sequence[str | Path],
    *,
    on_bad_input: OnBadInput = "fail",
    progress: bool = False,
) -> DecisionLog:
    """Read and check log files or directories; see the module docstring for bad input."""
    if on_bad_input not in ("fail", "skip"):
        raise ValueError(f"on_bad_input={on_bad_input!r} must be 'fail' or 'skip'")
    files = log_files(paths)
    result = DecisionLog(SCHEMA.empty_table(), files=files)
    tables: list[pa.Table] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(files), unit="file", desc="reading logs", leave=False, disable=None)
    for path in files:
        table, problem = _file_problem(path)
        if problem is None and table is not None:
            bad, row_problems = _row_problems(path, table)
            if row_problems:
                if on_bad_input == "fail":
                    raise LogInputError(row_problems[0])
                result.problems.extend(row_problems)
                table = table.filter(pa.array(~bad))
            tables.append(table)
        elif problem is not None:
            if on_bad_input == "fail":
                raise LogInputError(problem)
            result.problems.append(problem)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if tables:
        result.table = pa.concat_tables(tables)
    return result
