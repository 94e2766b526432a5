"""Schema of the decision log: one row per request per step, versioned.

A row is one applied decision (the arm a request ran in one scheduler step,
with the probability it was drawn with) and what came of it (tokens drafted
and accepted, the step's time). Class, arm and engine names are
dictionary-encoded, so a row costs a few bytes after compression. The version
lives in the Parquet key-value metadata under :data:`VERSION_KEY`; readers
reject versions they do not know.

Versions:

1. the columns up to ``report_sequence``.
2. adds ``batch_drafter`` and ``draft_k``: the drafter the engine runs for the
   whole batch and the K it drafted at in the step (``""`` and -1 when the
   engine did not report it). vLLM drafts at the end of a step, at the K of
   the arms chosen in it; those drafts are verified in the next step, so a
   step's rows name the arms chosen one step earlier while its time holds the
   drafting of its own K. A version-1 file reads with the defaults
   (:func:`with_absent_columns`): learned from as from an engine that does not
   send the column.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from specctl.steps import StepBatch

SCHEMA_VERSION = 2
VERSION_KEY = b"specctl.decision_log.schema_version"
SUPPORTED_VERSIONS = frozenset({1, 2})
# What a column holds in a file of a version before it: not reported.
NO_BATCH_DRAFTER = ""
NO_DRAFT_K = -1

_DICT = pa.dictionary(pa.int32(), pa.string())

SCHEMA = pa.schema(
    [
        pa.field("time_unix_s", pa.float64(), nullable=False),  # when the step ended
        pa.field("engine_id", _DICT, nullable=False),
        pa.field("step_index", pa.int64(), nullable=False),
        pa.field("workload_class", _DICT, nullable=False),
        pa.field("load_bucket", pa.int32(), nullable=False),
        pa.field("arm", _DICT, nullable=False),  # "off" or "<drafter>/k=<K>"
        pa.field("propensity", pa.float64(), nullable=False),  # P(arm) for (class, bucket)
        pa.field("drafted", pa.int32(), nullable=False),
        pa.field("accepted", pa.int32(), nullable=False),
        pa.field("step_time_s", pa.float64(), nullable=False),  # the whole step's wall time
        pa.field("num_requests", pa.int32(), nullable=False),  # rows in the step
        pa.field("batch_size", pa.int32(), nullable=False),
        pa.field("num_scheduled_tokens", pa.int32(), nullable=False),
        pa.field("policy_version", pa.int64(), nullable=False),
        pa.field("report_sequence", pa.int64(), nullable=False),
        # since version 2: the batch drafter ("": none reported) and the K it drafted at
        # in the step (-1: not reported)
        pa.field("batch_drafter", _DICT, nullable=False),
        pa.field("draft_k", pa.int32(), nullable=False),
    ],
    metadata={VERSION_KEY: str(SCHEMA_VERSION).encode()},
)


# The version each column first appears in (the others are in every version).
ADDED_IN = {"batch_drafter": 2, "draft_k": 2}


def columns_of_version(version: int) -> list[str]:
    """The columns a file of ``version`` holds, in schema order."""
    return [name for name in SCHEMA.names if ADDED_IN.get(name, 1) <= version]


def with_absent_columns(table: pa.Table) -> pa.Table:
    """``table`` (the columns of an older version, in schema order) with the columns
    added since filled with what they hold when nothing was reported, as :data:`SCHEMA`."""
    n = table.num_rows
    defaults = {
        "batch_drafter": _dict_column(np.zeros(n, dtype=np.int32), [NO_BATCH_DRAFTER]),
        "draft_k": pa.array(np.full(n, NO_DRAFT_K, dtype=np.int32), type=pa.int32()),
    }
    arrays = [
        table.column(name) if name in table.column_names else defaults[name]
        for name in SCHEMA.names
    ]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def _dict_column(indices: np.ndarray, values: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(
        pa.array(indices, type=pa.int32()), pa.array(values, type=pa.string())
    )


def batch_to_table(batch: StepBatch) -> pa.Table:
    """The rows of one validated report, each step's rows grouped by class.

    Rows of one (step, class) are adjacent: they share one draw of the arm, and
    replay treats them as one unit.
    """
    return batches_to_table([batch])


def batches_to_table(batches: Sequence[StepBatch]) -> pa.Table:
    """The rows of several reports as one table: the rows of ``batch_to_table`` of each, in order.

    Building one table for many reports costs per row, not per report: the
    writer converts what it buffered once per flush, off the report path.
    """
    engines: dict[str, int] = {}
    classes: dict[str, int] = {}
    arms: dict[str, int] = {}
    batch_drafters: dict[str, int] = {}
    cols: dict[str, list[np.ndarray]] = {name: [] for name in SCHEMA.names}
    for b in batches:
        order = np.lexsort((b.class_index, b.request_step))
        step = b.request_step[order]
        r = b.num_rows
        cmap = np.array([classes.setdefault(c, len(classes)) for c in b.classes], dtype=np.int32)
        amap = np.array([arms.setdefault(a.name, len(arms)) for a in b.arms], dtype=np.int32)
        engine = engines.setdefault(b.engine_id, len(engines))
        cols["time_unix_s"].append(b.step_end_unix_s[step])
        cols["engine_id"].append(np.full(r, engine, dtype=np.int32))
        cols["step_index"].append(b.step_index[step])
        cols["workload_class"].append(cmap[b.class_index[order]] if r else np.zeros(0, np.int32))
        cols["load_bucket"].append(b.load_bucket[step])
        cols["arm"].append(amap[b.arm_index[order]] if r else np.zeros(0, np.int32))
        cols["propensity"].append(b.propensity[order])
        cols["drafted"].append(b.drafted[order])
        cols["accepted"].append(b.accepted[order])
        cols["step_time_s"].append(b.step_time_s[step])
        cols["num_requests"].append(b.num_requests[step])
        cols["batch_size"].append(b.batch_size[step])
        cols["num_scheduled_tokens"].append(b.num_scheduled_tokens[step])
        cols["policy_version"].append(b.policy_version[step])
        cols["report_sequence"].append(np.full(r, b.sequence, dtype=np.int64))
        # the drafter's K per step, None when the engine did not report one
        draft_k = b.draft_k if b.batch_drafter != NO_BATCH_DRAFTER else None
        drafter = batch_drafters.setdefault(
            b.batch_drafter if draft_k is not None else NO_BATCH_DRAFTER, len(batch_drafters)
        )
        cols["batch_drafter"].append(np.full(r, drafter, dtype=np.int32))
        cols["draft_k"].append(draft_k[step] if draft_k is not None else np.full(r, NO_DRAFT_K))
    tables = {
        "engine_id": list(engines),
        "workload_class": list(classes),
        "arm": list(arms),
        "batch_drafter": list(batch_drafters),
    }
    arrays = []
    for field_ in SCHEMA:
        parts = cols[field_.name]
        values = np.concatenate(parts) if parts else np.zeros(0)
        if field_.name in tables:
            arrays.append(_dict_column(values.astype(np.int32), tables[field_.name]))
        else:
            arrays.append(pa.array(values, type=field_.type))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)
