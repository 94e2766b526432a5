"""The source check of vLLM against what specctl's engine side relies on.

It runs on the installed vLLM's source (all of it must hold) and on small
synthetic trees made from it with one thing changed, so each kind of break is
reported as exactly that item, and nothing else.
"""

from __future__ import annotations

import importlib.util
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from specctl.engine.vllm_compat import (
    INVENTORY,
    Field,
    Method,
    VllmSource,
    check_source,
    describe,
    version_supported,
)

vllm = pytest.importorskip("vllm")
INSTALLED = Path(vllm.__file__).parent
SCHEDULER = "vllm/v1/core/sched/scheduler.py"


def _modules() -> set[str]:
    return {item.module for item in INVENTORY}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of only the installed vLLM files the inventory names."""
    root = tmp_path / "src"
    for module in _modules():
        relpath = module.replace(".", "/") + ".py"
        target = root / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(INSTALLED.parent / relpath, target)
    (root / "vllm" / "__init__.py").touch()
    return root


def _problems(root: Path) -> dict[str, str]:
    return {
        describe(f.item): f.problem for f in check_source(VllmSource(root)) if f.problem is not None
    }


def _edit(root: Path, relpath: str, old: str, new: str) -> None:
    file = root / relpath
    text = file.read_text()
    assert text.count(old) == 1, old
    file.write_text(text.replace(old, new))


def test_supported_versions() -> None:
    assert all(version_supported(v) for v in ("0.32.0", "0.32.4", "0.33.0", "0.33.2"))
    assert not any(version_supported(v) for v in ("0.31.4", "0.34.0", "0.3", "0.330.0"))


def test_installed_vllm_holds_every_item() -> None:
    source = VllmSource(INSTALLED)
    assert version_supported(source.version())
    assert _problems(INSTALLED) == {}


def test_the_copied_tree_holds_every_item(tree: Path) -> None:
    assert _problems(tree) == {}


def test_a_missing_hook_is_reported(tree: Path) -> None:
    _edit(tree, SCHEDULER, "def update_draft_token_ids(", "def update_draft_tokens(")
    assert _problems(tree) == {
        "Scheduler.update_draft_token_ids(draft_token_ids)": (
            "Scheduler.update_draft_token_ids is not defined in Scheduler"
        ),
        "Scheduler.update_draft_token_ids uses request.spec_token_ids": (
            "Scheduler.update_draft_token_ids is not defined in Scheduler"
        ),
        "Scheduler.update_draft_token_ids uses self.structured_output_manager.validate_tokens": (
            "Scheduler.update_draft_token_ids is not defined in Scheduler"
        ),
    }


def test_a_changed_ngram_matcher_is_reported(tree: Path) -> None:
    matcher = "_find_longest_matched_ngram_and_propose_tokens"
    relpath = "vllm/v1/spec_decode/ngram_proposer.py"
    _edit(tree, relpath, "    min_ngram: int,\n    max_ngram: int,", "    max_ngram: int,")
    described = f"{matcher}(origin_tokens, min_ngram, max_ngram, max_model_len, k)"
    assert _problems(tree) == {
        described: (
            f"{matcher} takes (origin_tokens, max_ngram, max_model_len, k), specctl passes "
            "(origin_tokens, min_ngram, max_ngram, max_model_len, k)"
        )
    }
    _edit(tree, relpath, f"def {matcher}(", "def find_ngram(")
    assert _problems(tree) == {
        described: f"function {matcher} is missing from vllm.v1.spec_decode.ngram_proposer"
    }


def test_a_property_turned_into_a_method_is_reported(tree: Path) -> None:
    _edit(
        tree, "vllm/v1/request.py", "    @property\n    def use_structured_output(",
        "    def use_structured_output(",
    )  # fmt: skip
    assert _problems(tree) == {
        "Request.use_structured_output": "Request has no property 'use_structured_output'"
    }


def test_a_changed_signature_is_reported(tree: Path) -> None:
    _edit(
        tree,
        SCHEDULER,
        "def add_request(self, request: Request) -> None:",
        "def add_request(self, request: Request, priority: int = 0) -> None:",
    )
    assert _problems(tree) == {
        "Scheduler.add_request(request)": (
            "Scheduler.add_request takes (request, priority), specctl's override takes (request)"
        ),
    }


def test_a_hook_forwarding_args_only_needs_its_leading_parameters(tree: Path) -> None:
    """specctl's schedule takes (*args, **kwargs): a new trailing parameter is harmless."""
    _edit(
        tree,
        SCHEDULER,
        "def schedule(self, throttle_prefills: bool = False)",
        "def schedule(self, throttle_prefills: bool = False, budget: int = 0)",
    )
    assert _problems(tree) == {}
    _edit(tree, SCHEDULER, "def schedule(self, throttle_prefills", "def schedule(self, throttle")
    assert _problems(tree) == {
        "Scheduler.schedule(throttle_prefills)": (
            "Scheduler.schedule takes (throttle, budget), not starting with (throttle_prefills)"
        ),
    }


def test_a_dropped_field_and_attribute_are_reported(tree: Path) -> None:
    _edit(
        tree,
        "vllm/v1/core/sched/output.py",
        "    num_spec_tokens_to_schedule: int",
        "    num_draft_tokens: int",
    )
    text = (tree / SCHEDULER).read_text()
    (tree / SCHEDULER).write_text(text.replace("self.dynamic_sd_lookup", "self.sd_lookup"))
    assert _problems(tree) == {
        "SchedulerOutput.num_spec_tokens_to_schedule": (
            "SchedulerOutput declares no field 'num_spec_tokens_to_schedule'"
        ),
        "Scheduler.dynamic_sd_lookup": "Scheduler never assigns self.dynamic_sd_lookup",
        "Scheduler.schedule uses self.dynamic_sd_lookup": (
            "Scheduler.schedule no longer uses self.dynamic_sd_lookup"
        ),
    }


def test_a_hook_vllm_no_longer_calls_is_reported(tree: Path) -> None:
    text = (tree / SCHEDULER).read_text()
    (tree / SCHEDULER).write_text(
        text.replace("self._update_request_as_session(", "self._fold_session(")
    )
    assert _problems(tree) == {
        "Scheduler.add_request uses self._update_request_as_session": (
            "Scheduler.add_request no longer uses self._update_request_as_session"
        ),
    }


def test_a_missing_module_is_reported_for_its_items(tree: Path) -> None:
    (tree / "vllm" / "v1" / "request.py").unlink()
    problems = _problems(tree)
    request_items = [describe(i) for i in INVENTORY if i.module == "vllm.v1.request"]
    assert sorted(problems) == sorted(request_items)
    assert set(problems.values()) == {"module vllm.v1.request is missing"}


def test_a_wheel_is_read_without_unpacking(tree: Path, tmp_path: Path) -> None:
    wheel = tmp_path / "vllm-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for file in tree.rglob("*.py"):
            archive.write(file, file.relative_to(tree).as_posix())
        archive.writestr("vllm-9.9.9.dist-info/METADATA", "Name: vllm\nVersion: 9.9.9\n")
    source = VllmSource(wheel)
    assert source.version() == "9.9.9"
    assert all(f.problem is None for f in check_source(source))


def _script_main() -> Callable[[list[str]], int]:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "check_vllm_source.py"
    spec = importlib.util.spec_from_file_location("check_vllm_source", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    main: Callable[[list[str]], int] = module.main
    return main


def test_the_script_exits_non_zero_on_a_break(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main = _script_main()
    assert main([str(tree)]) == 0
    _edit(tree, SCHEDULER, "def update_from_output(", "def process_output(")
    assert main([str(tree)]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS: Scheduler.update_from_output is not defined in Scheduler" in out
    assert f"{len(INVENTORY) - 1} of {len(INVENTORY)} items OK, 1 differ" in out


def test_the_start_up_check_reads_the_same_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook added to the inventory is checked at start-up too: the two cannot drift."""
    from specctl.engine import vllm_compat
    from specctl.engine.scheduler import UnsupportedVllmError, check_vllm_supported

    check_vllm_supported()  # the installed vLLM holds
    hook = Method(
        "vllm.v1.core.sched.scheduler", "Scheduler", "add_request", ("req",), True, "test"
    )
    field = Field("vllm.v1.core.sched.output", "SchedulerOutput", "k_per_step", "declared", "t")
    monkeypatch.setattr(vllm_compat, "INVENTORY", (*INVENTORY, hook, field))
    with pytest.raises(UnsupportedVllmError) as error:
        check_vllm_supported()
    assert str(error.value).endswith(
        "Scheduler.add_request takes (request), specctl's override takes (req); "
        "SchedulerOutput has no field 'k_per_step'"
    )
