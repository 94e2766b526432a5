"""The model the benchmark's engine serves: a built-in one, built and cached, or a directory.

The built-in models are built at run time without downloads (seeded, so a
cached build is the same model), which lets the benchmark run on a machine
with no model at hand.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from specctl.bench.workload import Workload


def prepare_model(workload: Workload, models_dir: Path) -> tuple[str, dict[str, Any]]:
    """The target model's directory and vLLM's speculative_config, building a built-in
    model (seeded, cached under ``models_dir``) when the workload names one."""
    spec = dict(workload.speculative)
    m = workload.model
    if m.builtin == "testbed":
        from specctl.demo.testbed_model import TestbedConfig, build_testbed_models

        config = TestbedConfig(**dict(m.testbed))
        digest = hashlib.sha256(json.dumps(config.to_json(), sort_keys=True).encode())
        target, draft = build_testbed_models(
            models_dir / f"testbed-{digest.hexdigest()[:10]}", config
        )
        if spec["method"] == "draft_model" and "model" not in spec:
            spec["model"] = str(draft)
        return str(target), spec
    if m.builtin == "tiny":
        from specctl.testing.tiny_model import build_tiny_model

        return str(build_tiny_model(models_dir / "tiny")), spec
    assert m.path is not None
    if not m.path.is_dir():
        raise FileNotFoundError(f"model.path {m.path} is not a directory")
    return str(m.path), spec
