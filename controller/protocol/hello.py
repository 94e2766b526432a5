"""The Hello that opens an engine's stream: who the engine is and what it can run.

:func:`validate_hello` checks it once, so a session holds the engine's offered
drafters (name -> largest K) and fallback arm as values it can trust.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from specctl import __version__
from specctl.api import pb
from specctl.arms import MAX_K, OFF, Arm, ArmError, parse_arm

MAX_ENGINE_ID_LEN = 128
MAX_TEXT_FIELD_LEN = 256
ENGINE_ID_RE = re.compile(r"^[\x21-\x7e]{1,128}$")


class HelloError(ValueError):
    """A Hello this sidecar cannot accept; the message names the field."""


def validate_hello(hello: pb.Hello) -> tuple[dict[str, int], Arm]:
    """Check a Hello; return the offered drafters (name -> max K) and the fallback arm."""
    if not ENGINE_ID_RE.match(hello.engine_id):
        raise HelloError(
            f"hello.engine_id={hello.engine_id[: MAX_ENGINE_ID_LEN + 8]!r} must be 1-"
            f"{MAX_ENGINE_ID_LEN} printable characters without spaces"
        )
    for name in ("model", "vllm_version", "specctl_version"):
        if len(getattr(hello, name)) > MAX_TEXT_FIELD_LEN:
            raise HelloError(f"hello.{name} is longer than {MAX_TEXT_FIELD_LEN} characters")
    offered: dict[str, int] = {}
    for i, d in enumerate(hello.drafters):
        where = f"hello.drafters[{i}]"
        try:
            Arm(d.method, 1)
        except ArmError as exc:
            raise HelloError(f"{where}.method={d.method!r}: {exc}") from None
        if not 1 <= d.max_k <= MAX_K:
            raise HelloError(f"{where}.max_k={d.max_k} must be in 1..{MAX_K}")
        if d.method in offered:
            raise HelloError(f"{where}.method={d.method!r} is listed twice")
        offered[d.method] = int(d.max_k)
    try:
        fallback = parse_arm(hello.fallback_arm) if hello.fallback_arm else OFF
    except ArmError as exc:
        raise HelloError(f"hello.fallback_arm: {exc}") from None
    if hello.batch_drafter and hello.batch_drafter not in offered:
        raise HelloError(
            f"hello.batch_drafter={hello.batch_drafter[:40]!r} is not among the drafters offered"
        )
    if not fallback.is_off and fallback.k > offered.get(fallback.drafter, 0):
        raise HelloError(
            f"hello.fallback_arm={hello.fallback_arm!r} is not among the drafters offered"
        )
    return offered, fallback


def hello_message(
    engine_id: str,
    offered: Mapping[str, int],
    fallback: Arm,
    *,
    model: str = "",
    vllm_version: str = "",
    max_batch_size: int = 0,
    batch_drafter: str = "",
) -> pb.Hello:
    """The Hello of an engine offering ``offered`` (drafter -> max K) with ``fallback``."""
    return pb.Hello(
        engine_id=engine_id,
        model=model,
        vllm_version=vllm_version,
        drafters=[pb.Drafter(method=d, max_k=k) for d, k in sorted(offered.items())],
        max_batch_size=max_batch_size,
        fallback_arm=fallback.name,
        specctl_version=__version__,
        batch_drafter=batch_drafter,
    )
