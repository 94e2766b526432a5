"""Configuration reload: what changes live when the file changes (or on SIGHUP).

The policy section (the policy and its parameters, overrides, the fallback
arm, push settings) and the admin section apply at once; a change to the
server, log or fleet sections, or to the load buckets, the default class or the
class bound, is logged as needing a restart. A file that does not load leaves
everything as it was.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from specctl.arms import parse_arm
from specctl.logs import get_logger
from specctl.policy.registry import make_policy
from specctl.sidecar.admin_auth import AdminAuthInterceptor
from specctl.sidecar.book import PolicyBook
from specctl.sidecar.config import ConfigError, SidecarConfig, load_config
from specctl.sidecar.learning import Learner
from specctl.sidecar.publishing import Publisher

log = get_logger(__name__)

CONFIG_POLL_S = 1.0


class ConfigReloader:
    """Holds the running configuration and applies a re-read file to the book, the
    admin interceptor, the publisher and the learner.

    ``flag_overrides`` ("section.key" -> value) are re-applied on every reload,
    so command-line flags keep winning over the file.
    """

    def __init__(
        self,
        config: SidecarConfig,
        flag_overrides: Mapping[str, Any],
        book: PolicyBook,
        admin_auth: AdminAuthInterceptor,
        publisher: Publisher,
        learner: Learner,
    ) -> None:
        self.config = config
        self.flag_overrides = dict(flag_overrides)
        self.book = book
        self.admin_auth = admin_auth
        self.publisher = publisher
        self.learner = learner
        self._mtime = self._file_mtime()

    def _file_mtime(self) -> float | None:
        if not self.config.path:
            return None
        try:
            return os.stat(self.config.path).st_mtime_ns / 1e9
        except OSError:
            return None

    async def watch(self) -> None:
        """Reload whenever the file's modification time changes."""
        while True:
            await asyncio.sleep(CONFIG_POLL_S)
            mtime = self._file_mtime()
            if mtime is not None and mtime != self._mtime:
                self._mtime = mtime
                self.reload()

    def reload(self) -> bool:
        """Re-read the configuration file; apply what can change live. True if applied."""
        if not self.config.path:
            return False
        try:
            new = load_config(self.config.path, overrides=self.flag_overrides)
            token = new.admin.read_token()
            policy = None
            if (new.policy.name, dict(new.policy.params)) != (
                self.config.policy.name,
                dict(self.config.policy.params),
            ):
                policy = make_policy(
                    new.policy.name,
                    new.policy.params,
                    load_bucket_bounds=new.policy.load_bucket_bounds,
                )
        except (ConfigError, ValueError, OSError) as exc:
            log.error("config_reload_failed", path=self.config.path, error=str(exc))
            return False
        old = self.config
        for name in ("server", "log", "fleet"):
            if getattr(old, name) != getattr(new, name):
                log.warning("config_needs_restart", section=name)
        if (
            new.policy.load_bucket_bounds != old.policy.load_bucket_bounds
            or new.policy.default_class != old.policy.default_class
            or new.policy.max_classes != old.policy.max_classes
        ):
            log.warning(
                "config_needs_restart",
                keys="policy.load_bucket_bounds, policy.default_class, policy.max_classes",
            )
        book = self.book
        version = book.version
        book.push_threshold = new.policy.push_threshold
        if new.policy.fallback_arm != old.policy.fallback_arm:
            # the fallback is part of every engine's policy: a new version
            book.set_fallback_arm(
                parse_arm(new.policy.fallback_arm) if new.policy.fallback_arm else None
            )
        if policy is not None:
            book.replace_policy(policy, new.policy.name)
        for cls in old.policy.overrides.keys() | new.policy.overrides.keys():
            arm = new.policy.overrides.get(cls)
            if arm != old.policy.overrides.get(cls):
                book.set_override(cls, parse_arm(arm) if arm else None)
        self.admin_auth.configure(new.admin, token)
        self.config = SidecarConfig(
            server=old.server,
            policy=new.policy,
            admin=new.admin,
            log=old.log,
            state=old.state,
            fleet=old.fleet,
            path=old.path,
        )
        self.publisher.configure(new.policy)
        self.learner.configure(new.policy)
        log.info(
            "config_reloaded", path=new.path, policy=new.policy.name, policy_version=book.version
        )
        if book.version != version:
            self.publisher.notify()
        return True
