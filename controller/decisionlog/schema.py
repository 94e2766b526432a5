"""Schema of the decision log: one row per request per step, versioned.

A row is one applied decision (the arm a request ran in one scheduler step,
with the probability it was drawn with) and what came of it (tokens drafted
and accepted, the step's time). Class, arm and engine names are
dictionary-encoded, so a row costs a few bytes after compression. The version
lives in the Parquet key-value metadata under :data:`VERSION_KEY`; readers
reject versions they do not know.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from controller.steps import StepBatch

SCHEMA_VERSION = 1
VERSION_KEY = b"specctl.decision_log.schema_version"
SUPPORTED_VERSIONS = frozenset({1})

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
    ],
    metadata={VERSION_KEY: str(SCHEMA_VERSION).encode()},
)


def _dict_column(indices: np.ndarray, values: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(
        pa.array(indices, type=pa.int32()), pa.array(values, type=pa.string())
    )


def batch_to_table(batch: StepBatch) -> pa.Table:
    """The rows of one validated report, each step's rows grouped by class.

    Rows of one (step, class) are adjacent: they share one draw of the arm, and
    replay treats them as one unit.
    """
    order = np.lexsort((batch.class_index, batch.request_step))
    step = batch.request_step[order]
    r = batch.num_rows
    columns = [
        pa.array(batch.step_end_unix_s[step], type=pa.float64()),
        _dict_column(np.zeros(r, dtype=np.int32), [batch.engine_id]),
        pa.array(batch.step_index[step], type=pa.int64()),
        _dict_column(batch.class_index[order], list(batch.classes)),
        pa.array(batch.load_bucket[step], type=pa.int32()),
        _dict_column(batch.arm_index[order], [a.name for a in batch.arms]),
        pa.array(batch.propensity[order], type=pa.float64()),
        pa.array(batch.drafted[order], type=pa.int32()),
        pa.array(batch.accepted[order], type=pa.int32()),
        pa.array(batch.step_time_s[step], type=pa.float64()),
        pa.array(batch.num_requests[step], type=pa.int32()),
        pa.array(batch.batch_size[step], type=pa.int32()),
        pa.array(batch.num_scheduled_tokens[step], type=pa.int32()),
        pa.array(batch.policy_version[step], type=pa.int64()),
        pa.array(np.full(r, batch.sequence), type=pa.int64()),
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)
