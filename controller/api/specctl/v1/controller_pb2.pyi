from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EngineMessage(_message.Message):
    __slots__ = ("hello", "report", "status")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    report: StepReport
    status: EngineStatus
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., report: _Optional[_Union[StepReport, _Mapping]] = ..., status: _Optional[_Union[EngineStatus, _Mapping]] = ...) -> None: ...

class ControllerMessage(_message.Message):
    __slots__ = ("policy", "rejected")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    policy: Policy
    rejected: ReportRejected
    def __init__(self, policy: _Optional[_Union[Policy, _Mapping]] = ..., rejected: _Optional[_Union[ReportRejected, _Mapping]] = ...) -> None: ...

class Drafter(_message.Message):
    __slots__ = ("method", "max_k")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    MAX_K_FIELD_NUMBER: _ClassVar[int]
    method: str
    max_k: int
    def __init__(self, method: _Optional[str] = ..., max_k: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("engine_id", "model", "vllm_version", "drafters", "max_batch_size", "fallback_arm", "specctl_version", "batch_drafter")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VLLM_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRAFTERS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_ARM_FIELD_NUMBER: _ClassVar[int]
    SPECCTL_VERSION_FIELD_NUMBER: _ClassVar[int]
    BATCH_DRAFTER_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    model: str
    vllm_version: str
    drafters: _containers.RepeatedCompositeFieldContainer[Drafter]
    max_batch_size: int
    fallback_arm: str
    specctl_version: str
    batch_drafter: str
    def __init__(self, engine_id: _Optional[str] = ..., model: _Optional[str] = ..., vllm_version: _Optional[str] = ..., drafters: _Optional[_Iterable[_Union[Drafter, _Mapping]]] = ..., max_batch_size: _Optional[int] = ..., fallback_arm: _Optional[str] = ..., specctl_version: _Optional[str] = ..., batch_drafter: _Optional[str] = ...) -> None: ...

class StepReport(_message.Message):
    __slots__ = ("sequence", "step_index", "step_time_s", "batch_size", "num_scheduled_tokens", "policy_version", "load_bucket", "num_requests", "step_end_unix_s", "class_table", "arm_table", "class_index", "arm_index", "propensity", "drafted", "accepted", "draft_k")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_SCHEDULED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOAD_BUCKET_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    STEP_END_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    CLASS_TABLE_FIELD_NUMBER: _ClassVar[int]
    ARM_TABLE_FIELD_NUMBER: _ClassVar[int]
    CLASS_INDEX_FIELD_NUMBER: _ClassVar[int]
    ARM_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROPENSITY_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DRAFT_K_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    step_index: _containers.RepeatedScalarFieldContainer[int]
    step_time_s: _containers.RepeatedScalarFieldContainer[float]
    batch_size: _containers.RepeatedScalarFieldContainer[int]
    num_scheduled_tokens: _containers.RepeatedScalarFieldContainer[int]
    policy_version: _containers.RepeatedScalarFieldContainer[int]
    load_bucket: _containers.RepeatedScalarFieldContainer[int]
    num_requests: _containers.RepeatedScalarFieldContainer[int]
    step_end_unix_s: _containers.RepeatedScalarFieldContainer[float]
    class_table: _containers.RepeatedScalarFieldContainer[str]
    arm_table: _containers.RepeatedScalarFieldContainer[str]
    class_index: _containers.RepeatedScalarFieldContainer[int]
    arm_index: _containers.RepeatedScalarFieldContainer[int]
    propensity: _containers.RepeatedScalarFieldContainer[float]
    drafted: _containers.RepeatedScalarFieldContainer[int]
    accepted: _containers.RepeatedScalarFieldContainer[int]
    draft_k: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sequence: _Optional[int] = ..., step_index: _Optional[_Iterable[int]] = ..., step_time_s: _Optional[_Iterable[float]] = ..., batch_size: _Optional[_Iterable[int]] = ..., num_scheduled_tokens: _Optional[_Iterable[int]] = ..., policy_version: _Optional[_Iterable[int]] = ..., load_bucket: _Optional[_Iterable[int]] = ..., num_requests: _Optional[_Iterable[int]] = ..., step_end_unix_s: _Optional[_Iterable[float]] = ..., class_table: _Optional[_Iterable[str]] = ..., arm_table: _Optional[_Iterable[str]] = ..., class_index: _Optional[_Iterable[int]] = ..., arm_index: _Optional[_Iterable[int]] = ..., propensity: _Optional[_Iterable[float]] = ..., drafted: _Optional[_Iterable[int]] = ..., accepted: _Optional[_Iterable[int]] = ..., draft_k: _Optional[_Iterable[int]] = ...) -> None: ...

class EngineStatus(_message.Message):
    __slots__ = ("in_fallback", "fallback_reason", "reports_dropped_total", "policy_age_s", "policy_version")
    IN_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    REPORTS_DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    POLICY_AGE_S_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    in_fallback: bool
    fallback_reason: str
    reports_dropped_total: int
    policy_age_s: float
    policy_version: int
    def __init__(self, in_fallback: _Optional[bool] = ..., fallback_reason: _Optional[str] = ..., reports_dropped_total: _Optional[int] = ..., policy_age_s: _Optional[float] = ..., policy_version: _Optional[int] = ...) -> None: ...

class ReportRejected(_message.Message):
    __slots__ = ("sequence", "code", "message")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    code: int
    message: str
    def __init__(self, sequence: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ClassPolicy(_message.Message):
    __slots__ = ("workload_class", "load_bucket", "arms", "probabilities", "explanation")
    WORKLOAD_CLASS_FIELD_NUMBER: _ClassVar[int]
    LOAD_BUCKET_FIELD_NUMBER: _ClassVar[int]
    ARMS_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    workload_class: str
    load_bucket: int
    arms: _containers.RepeatedScalarFieldContainer[str]
    probabilities: _containers.RepeatedScalarFieldContainer[float]
    explanation: str
    def __init__(self, workload_class: _Optional[str] = ..., load_bucket: _Optional[int] = ..., arms: _Optional[_Iterable[str]] = ..., probabilities: _Optional[_Iterable[float]] = ..., explanation: _Optional[str] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("version", "policy_name", "fallback_arm", "load_bucket_bounds", "default_class", "entries", "issued_unix_s")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_NAME_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_ARM_FIELD_NUMBER: _ClassVar[int]
    LOAD_BUCKET_BOUNDS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_CLASS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ISSUED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    version: int
    policy_name: str
    fallback_arm: str
    load_bucket_bounds: _containers.RepeatedScalarFieldContainer[int]
    default_class: str
    entries: _containers.RepeatedCompositeFieldContainer[ClassPolicy]
    issued_unix_s: float
    def __init__(self, version: _Optional[int] = ..., policy_name: _Optional[str] = ..., fallback_arm: _Optional[str] = ..., load_bucket_bounds: _Optional[_Iterable[int]] = ..., default_class: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[ClassPolicy, _Mapping]]] = ..., issued_unix_s: _Optional[float] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetEvidenceRequest(_message.Message):
    __slots__ = ("workload_class",)
    WORKLOAD_CLASS_FIELD_NUMBER: _ClassVar[int]
    workload_class: str
    def __init__(self, workload_class: _Optional[str] = ...) -> None: ...

class ArmEvidence(_message.Message):
    __slots__ = ("arm", "probability", "expected_tokens", "expected_step_time_s", "goodput", "goodput_low", "goodput_high", "prob_best")
    ARM_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_LOW_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_HIGH_FIELD_NUMBER: _ClassVar[int]
    PROB_BEST_FIELD_NUMBER: _ClassVar[int]
    arm: str
    probability: float
    expected_tokens: float
    expected_step_time_s: float
    goodput: float
    goodput_low: float
    goodput_high: float
    prob_best: float
    def __init__(self, arm: _Optional[str] = ..., probability: _Optional[float] = ..., expected_tokens: _Optional[float] = ..., expected_step_time_s: _Optional[float] = ..., goodput: _Optional[float] = ..., goodput_low: _Optional[float] = ..., goodput_high: _Optional[float] = ..., prob_best: _Optional[float] = ...) -> None: ...

class DrafterAcceptance(_message.Message):
    __slots__ = ("drafter", "conditional_acceptance", "observations")
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    CONDITIONAL_ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    drafter: str
    conditional_acceptance: _containers.RepeatedScalarFieldContainer[float]
    observations: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, drafter: _Optional[str] = ..., conditional_acceptance: _Optional[_Iterable[float]] = ..., observations: _Optional[_Iterable[float]] = ...) -> None: ...

class ClassEvidence(_message.Message):
    __slots__ = ("workload_class", "load_bucket", "arms", "drafters", "explanation", "override_arm", "rounds", "stability")
    WORKLOAD_CLASS_FIELD_NUMBER: _ClassVar[int]
    LOAD_BUCKET_FIELD_NUMBER: _ClassVar[int]
    ARMS_FIELD_NUMBER: _ClassVar[int]
    DRAFTERS_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_ARM_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    STABILITY_FIELD_NUMBER: _ClassVar[int]
    workload_class: str
    load_bucket: int
    arms: _containers.RepeatedCompositeFieldContainer[ArmEvidence]
    drafters: _containers.RepeatedCompositeFieldContainer[DrafterAcceptance]
    explanation: str
    override_arm: str
    rounds: float
    stability: DecisionStability
    def __init__(self, workload_class: _Optional[str] = ..., load_bucket: _Optional[int] = ..., arms: _Optional[_Iterable[_Union[ArmEvidence, _Mapping]]] = ..., drafters: _Optional[_Iterable[_Union[DrafterAcceptance, _Mapping]]] = ..., explanation: _Optional[str] = ..., override_arm: _Optional[str] = ..., rounds: _Optional[float] = ..., stability: _Optional[_Union[DecisionStability, _Mapping]] = ...) -> None: ...

class DecisionStability(_message.Message):
    __slots__ = ("mode_arm", "mode_since_unix_s", "mode_dwell_s", "mode_flips_total", "changes_total", "change_tv_total", "window_s", "mode_flips_recent", "changes_recent", "change_tv_recent", "mode_flips_per_minute", "change_tv_per_second")
    MODE_ARM_FIELD_NUMBER: _ClassVar[int]
    MODE_SINCE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    MODE_DWELL_S_FIELD_NUMBER: _ClassVar[int]
    MODE_FLIPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CHANGES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CHANGE_TV_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    MODE_FLIPS_RECENT_FIELD_NUMBER: _ClassVar[int]
    CHANGES_RECENT_FIELD_NUMBER: _ClassVar[int]
    CHANGE_TV_RECENT_FIELD_NUMBER: _ClassVar[int]
    MODE_FLIPS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    CHANGE_TV_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    mode_arm: str
    mode_since_unix_s: float
    mode_dwell_s: float
    mode_flips_total: int
    changes_total: int
    change_tv_total: float
    window_s: float
    mode_flips_recent: int
    changes_recent: int
    change_tv_recent: float
    mode_flips_per_minute: float
    change_tv_per_second: float
    def __init__(self, mode_arm: _Optional[str] = ..., mode_since_unix_s: _Optional[float] = ..., mode_dwell_s: _Optional[float] = ..., mode_flips_total: _Optional[int] = ..., changes_total: _Optional[int] = ..., change_tv_total: _Optional[float] = ..., window_s: _Optional[float] = ..., mode_flips_recent: _Optional[int] = ..., changes_recent: _Optional[int] = ..., change_tv_recent: _Optional[float] = ..., mode_flips_per_minute: _Optional[float] = ..., change_tv_per_second: _Optional[float] = ...) -> None: ...

class GetEvidenceResponse(_message.Message):
    __slots__ = ("policy_version", "policy_name", "classes")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_NAME_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    policy_name: str
    classes: _containers.RepeatedCompositeFieldContainer[ClassEvidence]
    def __init__(self, policy_version: _Optional[int] = ..., policy_name: _Optional[str] = ..., classes: _Optional[_Iterable[_Union[ClassEvidence, _Mapping]]] = ...) -> None: ...

class SetOverrideRequest(_message.Message):
    __slots__ = ("workload_class", "arm")
    WORKLOAD_CLASS_FIELD_NUMBER: _ClassVar[int]
    ARM_FIELD_NUMBER: _ClassVar[int]
    workload_class: str
    arm: str
    def __init__(self, workload_class: _Optional[str] = ..., arm: _Optional[str] = ...) -> None: ...

class SetOverrideResponse(_message.Message):
    __slots__ = ("policy_version",)
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    def __init__(self, policy_version: _Optional[int] = ...) -> None: ...

class ResetClassRequest(_message.Message):
    __slots__ = ("workload_class",)
    WORKLOAD_CLASS_FIELD_NUMBER: _ClassVar[int]
    workload_class: str
    def __init__(self, workload_class: _Optional[str] = ...) -> None: ...

class ResetClassResponse(_message.Message):
    __slots__ = ("policy_version",)
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    def __init__(self, policy_version: _Optional[int] = ...) -> None: ...
