"""Who a sidecar is in its fleet: its id, its pool of identical engines, its model, its key.

Acceptance is shared across the replicas of one model (the same drafters
propose the same tokens to the same target, whatever the hardware), step cost
only within a pool of identical engines (same model, drafters, batch bound and
vLLM version; the operator names the pool when hardware differs too). A pool
not configured is derived from the first engine's hello, so replicas of one
deployment find each other without configuration. A sidecar's id must be
stable across its restarts and unique in its pool: its own entry is
recognised by it, and so never merged into its own evidence.
"""

from __future__ import annotations

import hashlib
import re
import socket
from dataclasses import dataclass

from specctl.api import pb

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class FleetIdentity:
    """A sidecar's place in the fleet, once its pool and model are known."""

    sidecar_id: str
    pool: str
    model: str

    def key(self, prefix: str) -> str:
        """The key this sidecar publishes its evidence under."""
        return entry_key(prefix, self.pool, self.sidecar_id)


def entry_key(prefix: str, pool: str, sidecar_id: str) -> str:
    """``<prefix><pool>:<sidecar id>``: every entry lives under the prefix."""
    return f"{prefix}{pool}:{sidecar_id}"


def pool_of_hello(hello: pb.Hello) -> str:
    """The pool of identical engines an engine's hello describes: ``auto-`` and a hash of
    its model, drafters and their largest K, batch bound and vLLM version."""
    drafters = ",".join(f"{d.method}:{d.max_k}" for d in sorted(hello.drafters, key=_method))
    described = f"{hello.model}|{drafters}|{hello.max_batch_size}|{hello.vllm_version}"
    return "auto-" + hashlib.sha256(described.encode()).hexdigest()[:16]


def default_sidecar_id(listen: str) -> str:
    """The host name (a pod's name in Kubernetes) and a hash of the listen address, so
    two sidecars on one host differ and a restarted sidecar keeps its id."""
    host = _UNSAFE.sub("-", socket.gethostname())[:40].strip("-._") or "host"
    return f"{host}-{hashlib.sha256(listen.encode()).hexdigest()[:8]}"


def _method(drafter: pb.Drafter) -> str:
    return str(drafter.method)
