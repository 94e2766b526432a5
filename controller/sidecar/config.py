"""The sidecar's configuration: a TOML file, then SPECCTL_<SECTION>_<KEY>, then flags.

Every setting is checked once, here, with a message that names the key and the
value, so a bad deployment fails at start-up and not at the first report.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specctl.arms import ArmError, parse_arm
from specctl.logs import FORMATS, LEVELS
from specctl.steps import validate_class_name

ENV_PREFIX = "SPECCTL_"
# Top-level tables that belong to other specctl components sharing the file.
FOREIGN_SECTIONS = frozenset({"engine"})
SOCKET_MODES = {"0600": 0o600, "0660": 0o660}
MAX_LOAD_BUCKETS = 16
_HOST_PORT_RE = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.\-]+):(?P<port>[0-9]{1,5})$")


# Parameters a policy gets when it is chosen without any.
_DEFAULT_PARAMS: dict[str, dict[str, Any]] = {"static": {"arm": "off"}}


class ConfigError(ValueError):
    """A setting that is not valid; the message names the key and the value."""


def _fail(key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{key}={value!r}: {why}")


def _check_host_port(key: str, value: str, *, allow_port_zero: bool) -> None:
    match = _HOST_PORT_RE.match(value)
    if match is None:
        raise _fail(key, value, "must be host:port, e.g. 127.0.0.1:9400 (or [::1]:9400)")
    port = int(match.group("port"))
    if port > 65535 or (port == 0 and not allow_port_zero):
        raise _fail(key, value, "port must be in 1..65535")


def is_unix_address(address: str) -> bool:
    return address.startswith("unix:")


def unix_socket_path(address: str) -> str:
    """``unix:///run/x.sock`` or ``unix:/run/x.sock`` -> ``/run/x.sock``."""
    path = address[len("unix:") :]
    if path.startswith("//"):
        path = path[2:]
    return path


@dataclass(frozen=True)
class ServerConfig:
    listen: str = "unix:///tmp/specctl.sock"
    socket_mode: str = "0600"
    metrics_listen: str = "127.0.0.1:9400"
    max_message_bytes: int = 4 * 1024 * 1024
    grace_period_s: float = 5.0
    max_engines: int = 256
    # Per engine: step reports accepted per second (token bucket, one second of burst).
    max_reports_per_s: float = 1000.0
    # TLS for a TCP listener (PEM files, reloaded when they change); with a client CA, mTLS.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""

    def __post_init__(self) -> None:
        if is_unix_address(self.listen):
            path = unix_socket_path(self.listen)
            if not path.startswith("/") or path.endswith("/"):
                raise _fail(
                    "server.listen", self.listen, "a unix socket must be unix:///absolute/path"
                )
        else:
            # host:port; port 0 picks a free port (tests). All interfaces only when
            # written out (0.0.0.0 or [::]), never implied by an empty host.
            _check_host_port("server.listen", self.listen, allow_port_zero=True)
        if self.socket_mode not in SOCKET_MODES:
            raise _fail(
                "server.socket_mode", self.socket_mode, f"must be one of {sorted(SOCKET_MODES)}"
            )
        _check_host_port("server.metrics_listen", self.metrics_listen, allow_port_zero=True)
        if not 1024 <= self.max_message_bytes <= 256 * 1024 * 1024:
            raise _fail(
                "server.max_message_bytes", self.max_message_bytes, "must be in 1024..268435456"
            )
        if not 0.0 <= self.grace_period_s <= 300.0:
            raise _fail("server.grace_period_s", self.grace_period_s, "must be in [0, 300]")
        if not 1 <= self.max_engines <= 100_000:
            raise _fail("server.max_engines", self.max_engines, "must be in 1..100000")
        if not 0.0 < self.max_reports_per_s <= 1e6:
            raise _fail("server.max_reports_per_s", self.max_reports_per_s, "must be in (0, 1e6]")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise _fail(
                "server.tls_cert_file" if not self.tls_cert_file else "server.tls_key_file",
                "",
                "TLS needs both server.tls_cert_file and server.tls_key_file",
            )
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise _fail(
                "server.tls_client_ca_file",
                self.tls_client_ca_file,
                "mutual TLS needs server.tls_cert_file and server.tls_key_file too",
            )
        for key in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
            value = getattr(self, key)
            if value and not Path(value).is_file():
                raise _fail(f"server.{key}", value, "is not a readable file")
        if self.tls_cert_file and is_unix_address(self.listen):
            raise _fail("server.listen", self.listen, "TLS is for TCP listeners, not unix sockets")


@dataclass(frozen=True)
class PolicyConfig:
    name: str = "specctl"
    params: Mapping[str, Any] = field(default_factory=dict)
    default_class: str = "default"
    max_classes: int = 64
    load_bucket_bounds: tuple[int, ...] = (8, 32, 128)
    fallback_arm: str = ""
    push_threshold: float = 0.05
    min_push_interval_s: float = 0.5
    # Learn at most this often: reports that arrive in between are learned together in
    # the next round (one policy update and one republish for all of them).
    learn_interval_s: float = 0.5
    # Re-send the current policy this often even when it did not change, so an engine
    # can tell a quiet sidecar from a dead one (its max_policy_age_s); 0 disables.
    republish_interval_s: float = 10.0
    # class -> arm pinned from the configuration file ("off" disables speculation)
    overrides: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from specctl.policy.registry import POLICIES, make_policy

        if self.name not in POLICIES:
            raise _fail("policy.name", self.name, f"unknown policy; known: {sorted(POLICIES)}")
        if not isinstance(self.params, Mapping):
            raise _fail("policy.params", self.params, "must be a table")
        problem = validate_class_name(self.default_class)
        if problem is not None:
            raise _fail("policy.default_class", self.default_class, problem)
        if not 1 <= self.max_classes <= 10_000:
            raise _fail("policy.max_classes", self.max_classes, "must be in 1..10000")
        bounds = self.load_bucket_bounds
        if (
            len(bounds) >= MAX_LOAD_BUCKETS
            or any(b < 1 for b in bounds)
            or list(bounds) != sorted(set(bounds))
        ):
            raise _fail(
                "policy.load_bucket_bounds",
                list(bounds),
                f"must be strictly increasing positive batch sizes, at most "
                f"{MAX_LOAD_BUCKETS - 1} of them",
            )
        if self.fallback_arm:
            try:
                parse_arm(self.fallback_arm)
            except ArmError as exc:
                raise _fail("policy.fallback_arm", self.fallback_arm, str(exc)) from None
        if not 0.0 <= self.push_threshold <= 1.0:
            raise _fail("policy.push_threshold", self.push_threshold, "must be in [0, 1]")
        if not 0.0 <= self.min_push_interval_s <= 60.0:
            raise _fail(
                "policy.min_push_interval_s", self.min_push_interval_s, "must be in [0, 60]"
            )
        if not 0.0 <= self.learn_interval_s <= 60.0:
            raise _fail("policy.learn_interval_s", self.learn_interval_s, "must be in [0, 60]")
        if not 0.0 <= self.republish_interval_s <= 3600.0:
            raise _fail(
                "policy.republish_interval_s", self.republish_interval_s, "must be in [0, 3600]"
            )
        for cls, arm in self.overrides.items():
            key = f"policy.overrides.{cls}"
            problem = validate_class_name(cls)
            if problem is not None:
                raise _fail(key, arm, problem)
            try:
                parse_arm(str(arm))
            except ArmError as exc:
                raise _fail(key, arm, str(exc)) from None
        try:
            make_policy(self.name, self.params, load_bucket_bounds=self.load_bucket_bounds)
        except (ValueError, TypeError) as exc:
            raise _fail("policy.params", dict(self.params), str(exc)) from None


@dataclass(frozen=True)
class AdminConfig:
    enabled: bool = False
    token_file: str = ""
    # Comma-separated common names of client certificates (mTLS) allowed admin calls.
    client_cns: str = ""

    def __post_init__(self) -> None:
        if self.token_file and not Path(self.token_file).is_file():
            raise _fail("admin.token_file", self.token_file, "is not a readable file")

    def read_token(self) -> str:
        """The bearer token admin calls must carry, or "" when none is configured."""
        if not self.token_file:
            return ""
        token = Path(self.token_file).read_text().strip()
        if not token:
            raise _fail("admin.token_file", self.token_file, "is empty")
        return token


@dataclass(frozen=True)
class StateConfig:
    """Where learned state survives restarts: snapshots and the decision log (off when empty)."""

    dir: str = ""
    snapshot_interval_s: float = 10.0
    # Write the decision log under <dir>/decisions and replay its tail on start.
    decision_log: bool = True
    log_flush_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.dir and not self.dir.startswith("/"):
            raise _fail("state.dir", self.dir, "must be an absolute path")
        if not 0.05 <= self.snapshot_interval_s <= 86_400.0:
            raise _fail(
                "state.snapshot_interval_s", self.snapshot_interval_s, "must be in [0.05, 86400]"
            )
        if not 0.01 <= self.log_flush_interval_s <= 3600.0:
            raise _fail(
                "state.log_flush_interval_s", self.log_flush_interval_s, "must be in [0.01, 3600]"
            )


_KEY_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:._-]{0,63}$")
_FLEET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
FLEET_URL_SCHEMES = ("redis://", "rediss://", "unix://")


@dataclass(frozen=True)
class FleetConfig:
    """The shared evidence store (Redis or Valkey) the sidecars of many replicas learn
    through; off while ``url`` is empty (docs/fleet.md)."""

    # redis://host:port/db, rediss://host:port/db (TLS) or unix:///path/redis.sock
    url: str = ""
    # AUTH: an ACL user (empty: the default user) and a file holding the password
    username: str = ""
    password_file: str = ""
    # rediss://: the CA that signed the server's certificate (empty: the system's), and a
    # client certificate and key when the server asks for one
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # every key specctl reads or writes starts with it
    key_prefix: str = "specctl:fleet:"
    # identical engines (model, hardware, engine configuration) share step cost; empty:
    # derived from the first engine's hello
    pool: str = ""
    # this sidecar's name in the fleet, stable across its restarts and unique in the pool;
    # empty: the host name and a hash of server.listen
    sidecar_id: str = ""
    publish_interval_s: float = 1.0
    # a member that stops publishing ages out after this long
    entry_ttl_s: float = 10.0
    # each operation on the store
    timeout_s: float = 0.5
    # the longest wait between reconnection attempts (backoff with jitter up to it)
    reconnect_max_s: float = 30.0
    max_entry_bytes: int = 4 * 1024 * 1024
    max_members: int = 1024

    def __post_init__(self) -> None:
        if self.url:
            if not self.url.startswith(FLEET_URL_SCHEMES):
                raise _fail("fleet.url", self.url, f"must start with one of {FLEET_URL_SCHEMES}")
            rest = self.url.split("://", 1)[1]
            if not rest or rest.startswith("/") != self.url.startswith("unix://"):
                raise _fail(
                    "fleet.url",
                    self.url,
                    "needs a host (redis://, rediss://) or an absolute socket path (unix:///path)",
                )
            if "@" in rest.split("/", 1)[0]:
                raise _fail(
                    "fleet.url",
                    "<redacted>",
                    "must not carry credentials: use fleet.username and fleet.password_file",
                )
        for key in ("password_file", "tls_ca_file", "tls_cert_file", "tls_key_file"):
            value = getattr(self, key)
            if value and not Path(value).is_file():
                raise _fail(f"fleet.{key}", value, "is not a readable file")
        tls = ("tls_ca_file", "tls_cert_file", "tls_key_file")
        if any(getattr(self, key) for key in tls) and not self.url.startswith("rediss://"):
            raise _fail("fleet.url", self.url, "TLS settings need a rediss:// URL")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise _fail(
                "fleet.tls_cert_file" if not self.tls_cert_file else "fleet.tls_key_file",
                "",
                "a client certificate needs both fleet.tls_cert_file and fleet.tls_key_file",
            )
        if not _KEY_PREFIX_RE.match(self.key_prefix):
            raise _fail(
                "fleet.key_prefix",
                self.key_prefix,
                "must be 1-64 of [A-Za-z0-9:._-], starting alphanumeric",
            )
        for key in ("pool", "sidecar_id", "username"):
            value = getattr(self, key)
            if value and not _FLEET_NAME_RE.match(value):
                raise _fail(
                    f"fleet.{key}", value, "must be 1-64 of [A-Za-z0-9._-], starting alphanumeric"
                )
        if not 0.05 <= self.publish_interval_s <= 60.0:
            raise _fail(
                "fleet.publish_interval_s", self.publish_interval_s, "must be in [0.05, 60]"
            )
        if not 3.0 * self.publish_interval_s <= self.entry_ttl_s <= 3600.0:
            raise _fail(
                "fleet.entry_ttl_s",
                self.entry_ttl_s,
                "must be at least 3 x fleet.publish_interval_s and at most 3600",
            )
        if not 0.01 <= self.timeout_s <= 60.0:
            raise _fail("fleet.timeout_s", self.timeout_s, "must be in [0.01, 60]")
        if not 0.1 <= self.reconnect_max_s <= 3600.0:
            raise _fail("fleet.reconnect_max_s", self.reconnect_max_s, "must be in [0.1, 3600]")
        if not 1024 <= self.max_entry_bytes <= 512 * 1024 * 1024:
            raise _fail("fleet.max_entry_bytes", self.max_entry_bytes, "must be in 1024..536870912")
        if not 1 <= self.max_members <= 100_000:
            raise _fail("fleet.max_members", self.max_members, "must be in 1..100000")

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    def read_password(self) -> str | None:
        """The AUTH password, or None when no password file is configured."""
        if not self.password_file:
            return None
        password = Path(self.password_file).read_text().strip()
        if not password:
            raise _fail("fleet.password_file", self.password_file, "is empty")
        return password


@dataclass(frozen=True)
class LogConfig:
    format: str = "auto"
    level: str = "info"

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise _fail("log.format", self.format, f"must be one of {list(FORMATS)}")
        if self.level not in LEVELS:
            raise _fail("log.level", self.level, f"must be one of {list(LEVELS)}")


@dataclass(frozen=True)
class SidecarConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    log: LogConfig = field(default_factory=LogConfig)
    state: StateConfig = field(default_factory=StateConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    # The file it was loaded from, if any (watched for changes).
    path: str = ""

    def __post_init__(self) -> None:
        if self.admin.client_cns and not self.server.tls_client_ca_file:
            raise _fail(
                "admin.client_cns",
                self.admin.client_cns,
                "client certificates need mutual TLS: set server.tls_client_ca_file",
            )


SECTIONS: dict[str, type] = {
    "server": ServerConfig,
    "policy": PolicyConfig,
    "admin": AdminConfig,
    "log": LogConfig,
    "state": StateConfig,
    "fleet": FleetConfig,
}


def _coerce(key: str, value: Any, default: Any) -> Any:
    """Check a value's type against the default's, converting where it is unambiguous."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise _fail(key, value, "must be true or false")
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _fail(key, value, "must be an integer")
    if isinstance(default, float):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise _fail(key, value, "must be a number")
    if isinstance(default, str):
        if isinstance(value, str):
            return value
        raise _fail(key, value, "must be a string")
    if isinstance(default, tuple):
        if isinstance(value, list | tuple) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            return tuple(value)
        raise _fail(key, value, "must be a list of integers")
    if isinstance(default, Mapping):
        if isinstance(value, Mapping):
            return dict(value)
        raise _fail(key, value, "must be a table")
    return value


def _parse_env_value(key: str, raw: str, default: Any) -> Any:
    """Environment values are strings; non-string settings are read as TOML values."""
    if isinstance(default, str):
        return raw
    text = raw.strip()
    if isinstance(default, tuple) and not text.startswith("["):
        text = f"[{text}]"
    if isinstance(default, bool):
        text = text.lower()
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        raise _fail(key, raw, "is not a valid value for this setting") from None


def _name_first(item: tuple[str, Any]) -> bool:
    return item[0] != "name"


def _defaults(section: str) -> dict[str, Any]:
    cls = SECTIONS[section]
    return {f.name: getattr(cls(), f.name) for f in dataclasses.fields(cls)}


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SidecarConfig:
    """Defaults, then the TOML file at ``path``, then ``env``, then ``overrides``.

    ``overrides`` maps "section.key" to a value (command-line flags).
    ``env`` defaults to ``os.environ``; variables are SPECCTL_<SECTION>_<KEY>.
    """
    values: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    defaults = {s: _defaults(s) for s in SECTIONS}

    params_for = PolicyConfig.name

    def put(section: str, key: str, value: Any, where: str) -> None:
        nonlocal params_for
        if key not in defaults[section]:
            raise ConfigError(
                f"{where}: unknown key {section}.{key}; known: {sorted(defaults[section])}"
            )
        values[section][key] = _coerce(f"{section}.{key}", value, defaults[section][key])
        if (section, key) == ("policy", "params"):
            params_for = values["policy"].get("name", PolicyConfig.name)

    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {str(path)!r} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
        for section, table in data.items():
            if section in FOREIGN_SECTIONS:
                continue
            if section not in SECTIONS:
                raise ConfigError(
                    f"{path}: unknown section [{section}]; known: "
                    f"{sorted(SECTIONS | dict.fromkeys(FOREIGN_SECTIONS))}"
                )
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: {section} must be a table, not {table!r}")
            for key, value in sorted(table.items(), key=_name_first):
                put(section, key, value, str(path))

    environ = os.environ if env is None else env
    for name, raw in sorted(environ.items(), key=lambda kv: not kv[0].endswith("_NAME")):
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        section, _, key = rest.partition("_")
        if section not in SECTIONS:
            continue
        if key not in defaults[section]:
            raise ConfigError(
                f"{name}: unknown key {section}.{key}; known: {sorted(defaults[section])}"
            )
        put(section, key, _parse_env_value(name, raw, defaults[section][key]), name)

    for dotted, value in sorted((overrides or {}).items(), key=lambda kv: kv[0] != "policy.name"):
        section, _, key = dotted.partition(".")
        if section not in SECTIONS:
            raise ConfigError(f"unknown setting {dotted!r}")
        put(section, key, value, "command line")

    # Parameters belong to the policy they were written for: a policy chosen in a
    # later layer (environment, flags) without parameters starts from its defaults.
    name = values["policy"].get("name", PolicyConfig.name)
    if name != params_for:
        values["policy"]["params"] = dict(_DEFAULT_PARAMS.get(name, {}))
    try:
        return SidecarConfig(
            server=ServerConfig(**values["server"]),
            policy=PolicyConfig(**values["policy"]),
            admin=AdminConfig(**values["admin"]),
            log=LogConfig(**values["log"]),
            state=StateConfig(**values["state"]),
            fleet=FleetConfig(**values["fleet"]),
            path=str(path) if path else "",
        )
    except TypeError as exc:  # pragma: no cover - keys are checked above
        raise ConfigError(str(exc)) from None
