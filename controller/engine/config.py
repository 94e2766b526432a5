"""Engine-side settings, from ``SPECCTL_*`` environment variables and/or a TOML file.

The scheduler runs inside vLLM's engine-core process, which has no command
line of its own, so everything is read from the environment (optionally
pointing at a file with ``SPECCTL_CONFIG``). Environment variables win over
the file. Every value is checked here, once, with an error naming the key.
"""

from __future__ import annotations

import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specctl.arms import MAX_K, OFF, Arm, ArmError, parse_arm
from specctl.steps import validate_class_name

ENV_PREFIX = "SPECCTL_"
DEFAULT_ADDRESS = "unix:///tmp/specctl.sock"


STEP_CLOCKS = ("wall", "process_cpu")


class ConfigError(ValueError):
    """An engine setting that is not valid; the message names the key and the value."""


@dataclass(frozen=True)
class PromptLenClass:
    """Requests without a class whose prompt has at most ``max_tokens`` tokens get ``name``."""

    name: str
    max_tokens: int | None  # None: any length (the last entry)


@dataclass(frozen=True)
class EngineConfig:
    """What the scheduler plugin needs to know; defaults suit one engine next to its sidecar."""

    # The sidecar: "unix:///path", "host:port" or "dns:///host:port".
    address: str = DEFAULT_ADDRESS
    # The arm run without a fresh policy; None: the engine's own speculative setting.
    fallback_arm: str | None = None
    # Fall back when the last policy is older than this, seconds (0: never by age).
    max_policy_age_s: float = 60.0
    # The key in SamplingParams.extra_args (vllm_xargs) that names the workload class.
    class_key: str = "workload_class"
    # The class of requests that name none (and of those that name an invalid one).
    default_class: str = "default"
    # Optional: classes by prompt length for requests that name none.
    class_from_prompt_len: tuple[PromptLenClass, ...] = ()
    # At most this many distinct classes; requests naming more get the default class.
    max_classes: int = 64
    # Load bucket bounds used until the sidecar's policy brings its own.
    load_buckets: tuple[int, ...] = ()
    # Steps buffered for the sidecar; when full, the oldest are dropped and counted.
    # A queued step holds its batch's per-step vLLM objects (~50 KB at 256 requests).
    report_queue_size: int = 1024
    # How often the background thread sends what the steps recorded, seconds.
    report_interval_s: float = 0.2
    # Names this engine in the sidecar's logs and metrics; default host-pid.
    engine_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    # Seed for the per-step arm sampling (None: from the OS).
    seed: int | None = None
    # Reconnect backoff bounds, seconds.
    reconnect_min_s: float = 0.1
    reconnect_max_s: float = 5.0
    # What a step's time is measured on: "wall" (monotonic wall clock: what a GPU engine
    # spends) or "process_cpu" (CPU seconds of the engine core and its workers: on a CPU engine, its
    # cost without the time other processes on a shared machine take from it).
    step_clock: str = "wall"
    # Write a trace (every request's drafted and accepted tokens per step, the step's times)
    # as Parquet segments into this absolute directory, for trace-driven simulation.
    trace_dir: str = ""
    # TLS to a sidecar on TCP (PEM files, re-read at each connect): the CA that signed the
    # sidecar's certificate (empty: the system's roots); with a certificate and key, mTLS.
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # n-gram drafts next to the engine's model drafter (docs/drafters.md): the longest n-gram
    # arm (None: the engine's num_speculative_tokens; 0: no n-gram arms), and vLLM's
    # prompt_lookup_min/max for the matcher.
    ngram_max_k: int | None = None
    ngram_prompt_lookup_min: int = 5
    ngram_prompt_lookup_max: int = 5

    def __post_init__(self) -> None:
        if not self.address or any(c.isspace() for c in self.address):
            raise ConfigError(f"address={self.address!r} must be a non-empty gRPC target")
        if self.fallback_arm is not None:
            try:
                parse_arm(self.fallback_arm)
            except ArmError as exc:
                raise ConfigError(f"fallback_arm: {exc}") from None
        if not (0.0 <= self.max_policy_age_s <= 86400.0):
            raise ConfigError(f"max_policy_age_s={self.max_policy_age_s!r} must be in [0, 86400]")
        if not self.class_key:
            raise ConfigError("class_key must not be empty")
        problem = validate_class_name(self.default_class)
        if problem is not None:
            raise ConfigError(f"default_class: {problem}")
        for i, entry in enumerate(self.class_from_prompt_len):
            problem = validate_class_name(entry.name)
            if problem is not None:
                raise ConfigError(f"class_from_prompt_len[{i}]: {problem}")
            last = i == len(self.class_from_prompt_len) - 1
            if entry.max_tokens is None and not last:
                raise ConfigError(
                    f"class_from_prompt_len[{i}] {entry.name!r} has no bound: only the last "
                    "entry may omit ':<max_tokens>'"
                )
        bounds = [e.max_tokens for e in self.class_from_prompt_len if e.max_tokens is not None]
        if bounds != sorted(set(bounds)) or any(b <= 0 for b in bounds):
            raise ConfigError(f"class_from_prompt_len bounds {bounds} must be increasing and > 0")
        if not 1 <= self.max_classes <= 10_000:
            raise ConfigError(f"max_classes={self.max_classes} must be in 1..10000")
        if list(self.load_buckets) != sorted(set(self.load_buckets)) or any(
            b <= 0 for b in self.load_buckets
        ):
            raise ConfigError(
                f"load_buckets {list(self.load_buckets)} must be strictly increasing and > 0"
            )
        if not 1 <= self.report_queue_size <= 1_000_000:
            raise ConfigError(f"report_queue_size={self.report_queue_size} must be in 1..1000000")
        if not 0.001 <= self.report_interval_s <= 60.0:
            raise ConfigError(
                f"report_interval_s={self.report_interval_s!r} must be in [0.001, 60]"
            )
        if not self.engine_id or len(self.engine_id) > 128:
            raise ConfigError(f"engine_id={self.engine_id[:140]!r} must be 1-128 characters")
        if not 0.0 < self.reconnect_min_s <= self.reconnect_max_s <= 600.0:
            raise ConfigError(
                f"reconnect_min_s={self.reconnect_min_s!r} and reconnect_max_s="
                f"{self.reconnect_max_s!r} must satisfy 0 < min <= max <= 600"
            )

        if self.step_clock not in STEP_CLOCKS:
            raise ConfigError(
                f"step_clock={self.step_clock!r} must be one of {', '.join(STEP_CLOCKS)}"
            )
        if self.trace_dir and (
            not os.path.isabs(self.trace_dir)
            or (os.path.exists(self.trace_dir) and not os.path.isdir(self.trace_dir))
        ):
            raise ConfigError(
                f"trace_dir={self.trace_dir!r} must be an absolute path to a directory "
                "(created if missing)"
            )
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError(
                "tls_cert_file and tls_key_file go together: a client certificate needs its key"
            )
        for key in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
            path = getattr(self, key)
            if path and not os.path.isfile(path):
                raise ConfigError(f"{key}={path!r} is not a readable file")

        if self.ngram_max_k is not None and not 0 <= self.ngram_max_k <= MAX_K:
            raise ConfigError(f"ngram_max_k={self.ngram_max_k} must be in 0..{MAX_K}")
        if not 1 <= self.ngram_prompt_lookup_min <= self.ngram_prompt_lookup_max <= 1024:
            raise ConfigError(
                f"ngram_prompt_lookup_min={self.ngram_prompt_lookup_min} and "
                f"ngram_prompt_lookup_max={self.ngram_prompt_lookup_max} must satisfy "
                "1 <= min <= max <= 1024"
            )

    @property
    def tls(self) -> bool:
        return bool(self.tls_ca_file or self.tls_cert_file)

    def fallback(self, engine_default: Arm) -> Arm:
        """The fallback arm: the configured one, else the engine's own setting."""
        return engine_default if self.fallback_arm is None else parse_arm(self.fallback_arm)

    def class_for_prompt_len(self, num_prompt_tokens: int) -> str:
        for entry in self.class_from_prompt_len:
            if entry.max_tokens is None or num_prompt_tokens <= entry.max_tokens:
                return entry.name
        return self.default_class

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> EngineConfig:
        """Read ``SPECCTL_CONFIG`` (if set) and then the ``SPECCTL_*`` variables over it."""
        env = os.environ if environ is None else environ
        raw: dict[str, Any] = {}
        path = env.get(ENV_PREFIX + "CONFIG")
        if path:
            try:
                with open(path, "rb") as f:
                    doc = tomllib.load(f)
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"SPECCTL_CONFIG={path!r}: {exc}") from None
            # The engine's keys may sit at the top level or under [engine].
            table = doc.get("engine", doc)
            if not isinstance(table, dict):
                raise ConfigError(f"SPECCTL_CONFIG={path!r}: [engine] must be a table")
            for key, value in table.items():
                if key not in _PARSERS:
                    raise ConfigError(
                        f"SPECCTL_CONFIG={path!r}: unknown key {key!r}; known: "
                        f"{', '.join(sorted(_PARSERS))}"
                    )
                raw[key] = _parse(key, value, f"{path}: {key}")
        for key in _PARSERS:
            value = env.get(ENV_PREFIX + key.upper())
            if value is not None and value != "":
                raw[key] = _parse(key, value, ENV_PREFIX + key.upper())
        try:
            return cls(**raw)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(str(exc)) from None


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{where}={value!r} must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}={value!r} must be an integer") from None


def _float(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{where}={value!r} must be a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}={value!r} must be a number") from None


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}={value!r} must be a string")
    return value.strip()


def _int_list(value: Any, where: str) -> tuple[int, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ConfigError(f"{where}={value!r} must be a list of integers, e.g. '8,32,128'")
    return tuple(_int(v.strip() if isinstance(v, str) else v, where) for v in items if v != "")


def _prompt_len_classes(value: Any, where: str) -> tuple[PromptLenClass, ...]:
    """``short:256,medium:2048,long`` (a string) or the same as a TOML list of strings."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ConfigError(f"{where}={value!r} must look like 'short:256,medium:2048,long'")
    out: list[PromptLenClass] = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(
                f"{where}: entry {item!r} must be '<class>:<max_tokens>' or '<class>'"
            )
        name, sep, bound = item.strip().partition(":")
        out.append(PromptLenClass(name, _int(bound, f"{where} ({name})") if sep else None))
    return tuple(out)


def _optional_int(value: Any, where: str) -> int | None:
    return None if value in ("", None) else _int(value, where)


_PARSERS: dict[str, Any] = {
    "address": _str,
    "tls_ca_file": _str,
    "tls_cert_file": _str,
    "tls_key_file": _str,
    "fallback_arm": _str,
    "max_policy_age_s": _float,
    "class_key": _str,
    "default_class": _str,
    "class_from_prompt_len": _prompt_len_classes,
    "max_classes": _int,
    "load_buckets": _int_list,
    "report_queue_size": _int,
    "report_interval_s": _float,
    "engine_id": _str,
    "seed": _optional_int,
    "reconnect_min_s": _float,
    "reconnect_max_s": _float,
    "step_clock": _str,
    "trace_dir": _str,
    "ngram_max_k": _optional_int,
    "ngram_prompt_lookup_min": _int,
    "ngram_prompt_lookup_max": _int,
}


def _parse(key: str, value: Any, where: str) -> Any:
    return _PARSERS[key](value, where)


def engine_default_arm(method: str | None, num_speculative_tokens: int) -> Arm:
    """The arm that matches vLLM's own speculative setting (``off`` without one)."""
    if not method or num_speculative_tokens <= 0:
        return OFF
    return Arm(method, num_speculative_tokens)
