"""specctl's scheduler in a real vLLM engine (CPU build, tiny random Llama, n-gram drafter).

One engine for the module (offline ``LLM`` API) and the real sidecar as its own
process, so that it can be SIGKILLed and restarted. Two workload classes: a
random tiny model loops under greedy decoding, so n-gram drafts are often
accepted ("greedy"), while at temperature 1.0 they almost never are ("hot").
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from engine_support import (
    SidecarProcess,
    arm_rounds,
    distribution,
    engine_environment,
    running_sidecar,
)

from specctl.testing.tiny_engine import tiny_ngram_llm

pytestmark = pytest.mark.vllm

# After learning, the greedy class runs off on at most this share of its request-rounds,
# and the hot class's distribution puts at least this much on off or the nearly free K=1
# (the draft's first position costs under 5% of a step at 32 requests). A Thompson
# sampler's choices move from round to round: both hold over a window of rounds.
MAX_OFF_SHARE = 0.1
MIN_CHEAP_SHARE = 0.6
CHEAP_ARM = "ngram/k=1"
WINDOW_ROUNDS = 3
MAX_LEARNING_ROUNDS = 24
WORDS = ["The quick brown fox", "Speculative decoding", "def add(a, b):", "SELECT name",
         "Goodput is", "Once upon a time", '{"workload_class":', "0123456789 abc"]  # fmt: skip


def _prompts(n: int, offset: int = 0) -> list[str]:
    return [f"{WORDS[(i + offset) % len(WORDS)]} {i + offset}" for i in range(n)]


@pytest.fixture(scope="module")
def sidecar() -> Iterator[SidecarProcess]:
    with running_sidecar() as sc:
        yield sc


@pytest.fixture(scope="module")
def llm(sidecar: SidecarProcess, tiny_model: str) -> Iterator[Any]:
    # CPU seconds of the engine as the step clock: free of the time other processes on a
    # shared machine take
    settings = {"SPECCTL_RECONNECT_MAX_S": "1.0", "SPECCTL_STEP_CLOCK": "process_cpu"}
    with engine_environment(sidecar, settings):
        engine = tiny_ngram_llm(tiny_model, max_num_seqs=32, log_stats=True)
        yield engine
        engine.llm_engine.engine_core.shutdown()


def _params(workload_class: str, n: int, max_tokens: int, seed0: int = 0) -> list[Any]:
    from vllm import SamplingParams

    hot = workload_class == "hot"
    return [
        SamplingParams(
            temperature=1.0 if hot else 0.0,
            seed=seed0 + i if hot else None,
            max_tokens=max_tokens,
            ignore_eos=True,
            extra_args={"workload_class": workload_class},
        )
        for i in range(n)
    ]


def _spec_counters(llm: Any) -> tuple[int, int]:
    """vLLM's own counters: (draft tokens, accepted tokens) since the engine started."""
    drafted = accepted = 0
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_draft_tokens":
            drafted += int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens":
            accepted += int(metric.value)
    return drafted, accepted


def _pin(sidecar: SidecarProcess, arm: str, classes: tuple[str, ...] = ("greedy", "hot")) -> None:
    for c in classes:
        sidecar.override(c, arm)
    time.sleep(1.0)  # the push reaches the engine, which applies it from its next step


def _generate(llm: Any, prompts: list[str], params: list[Any]) -> tuple[list[list[int]], float]:
    t0 = time.monotonic()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.monotonic() - t0
    return [list(o.outputs[0].token_ids) for o in outs], wall


def test_greedy_text_is_identical_with_and_without_speculation(
    llm: Any, sidecar: SidecarProcess
) -> None:
    prompts = _prompts(8)
    params = _params("greedy", 8, 64)

    _pin(sidecar, "off", ("greedy",))
    d0, _ = _spec_counters(llm)
    reference, _ = _generate(llm, prompts, params)
    d1, _ = _spec_counters(llm)
    assert d1 == d0, "with the class pinned off, the engine still verified drafts"

    _pin(sidecar, "ngram/k=4", ("greedy",))
    with_k4, _ = _generate(llm, prompts, params)
    d2, _ = _spec_counters(llm)
    assert d2 > d1, "ngram/k=4 drafted nothing: the comparison would prove nothing"

    _pin(sidecar, "", ("greedy",))  # back to the learning policy, arms vary per step
    with_policy, _ = _generate(llm, prompts, params)

    assert all(len(t) == 64 for t in reference)
    for i, ref in enumerate(reference):
        assert with_k4[i] == ref, f"prompt {i}: ngram/k=4 changed the greedy output"
        assert with_policy[i] == ref, f"prompt {i}: specctl's policy changed the greedy output"


def test_each_class_learns_whether_speculation_pays(llm: Any, sidecar: SidecarProcess) -> None:
    """Two classes on opposite sides of ``off``: ``greedy`` accepts half of its first n-gram
    drafts (its output repeats itself), ``hot`` (temperature 1.0) almost none. Learning must
    take greedy off ``off`` and keep hot on ``off`` or the nearly free K=1.

    Which K is best within a side is not asserted: on this tiny model the arms K=1..4 of
    the greedy class lie within 10-30% of one another, less than a static sweep of engine
    CPU time moves from run to run on a shared machine (up to 50% between batches), so a
    sweep cannot referee them. The sides are physical: drafts that are never accepted only
    cost, and drafts accepted half the time at a nearly flat step cost pay. A policy pinned
    to ``off`` fails the first criterion, one pinned to the engine's K=4 the second.
    """
    n, max_tokens = 32, 128
    # The classes' acceptance, by vLLM's own counters, with both pinned to ngram/k=4.
    rates: dict[str, float] = {}
    for c in ("greedy", "hot"):
        _pin(sidecar, "ngram/k=4", (c,))
        d0, a0 = _spec_counters(llm)
        _generate(llm, _prompts(n, 100), _params(c, n, max_tokens, 1000))
        d1, a1 = _spec_counters(llm)
        assert d1 > d0, f"{c}: ngram/k=4 drafted nothing"
        rates[c] = (a1 - a0) / (d1 - d0)
    print(f"acceptance per drafted token at ngram/k=4: {rates}")
    assert rates["greedy"] > 0.15 and rates["hot"] < 0.05, rates

    # Learning: overrides cleared, a batch of each class per round, until the last
    # WINDOW_ROUNDS rounds meet both criteria on average. Greedy's choices are read from the
    # engine's own record (request-rounds per arm, in every load bucket the batch passes
    # through as it drains); hot's from its pushed distribution in the batch's bucket.
    _pin(sidecar, "")
    history: list[tuple[float, float]] = []
    window: list[tuple[float, float, float]] = []  # greedy off rounds, all rounds, hot cheap
    settled = False
    before = arm_rounds(sidecar, "greedy")
    for round_ in range(MAX_LEARNING_ROUNDS):
        # one batch of each class: in a batch shared with temperature-1.0 requests, vLLM's
        # CPU engine accepts far fewer of the greedy requests' drafts (at position 1, 0.17
        # instead of 0.43, by vLLM's own counters)
        offset = 200 + 2 * n * round_
        _generate(llm, _prompts(n, offset), _params("greedy", n, max_tokens))
        _generate(llm, _prompts(n, offset + n), _params("hot", n, max_tokens, 5000 + offset))
        greedy = distribution(sidecar, "greedy", n)
        hot = distribution(sidecar, "hot", n)
        after = arm_rounds(sidecar, "greedy")
        ran = {a: after.get(a, 0.0) - before.get(a, 0.0) for a in after}
        before = after
        off_rounds, all_rounds = ran.get("off", 0.0), max(sum(ran.values()), 1.0)
        hot_cheap = hot.get("off", 0.0) + hot.get(CHEAP_ARM, 0.0)
        history.append((round(off_rounds / all_rounds, 3), round(hot_cheap, 3)))
        print(f"round {round_}: greedy {greedy}, hot {hot}, greedy ran off {history[-1][0]:.2f}")
        window = [*window, (off_rounds, all_rounds, hot_cheap)][-WINDOW_ROUNDS:]
        if len(window) == WINDOW_ROUNDS:
            greedy_off = sum(w[0] for w in window) / sum(w[1] for w in window)
            hot_cheap_mean = statistics.mean(w[2] for w in window)
            if greedy_off <= MAX_OFF_SHARE and hot_cheap_mean >= MIN_CHEAP_SHARE:
                settled = True
                break
    for c in ("greedy", "hot"):
        for ce in sidecar.evidence().classes:
            if ce.workload_class == c and ce.rounds > 0:
                print(f"evidence {c} bucket {ce.load_bucket}: {ce.explanation}")
                for a in ce.arms:
                    print(
                        f"  {a.arm:<10} tokens {a.expected_tokens:.2f} step "
                        f"{1e3 * a.expected_step_time_s:.2f} ms goodput {a.goodput:.0f} "
                        f"p {a.probability:.2f}"
                    )
    assert settled, (
        f"specctl did not settle within {MAX_LEARNING_ROUNDS} rounds: over {WINDOW_ROUNDS} "
        f"rounds in a row, greedy running off on <= {MAX_OFF_SHARE:.0%} of its request-rounds "
        f"and hot's distribution putting >= {MIN_CHEAP_SHARE:.0%} on off or {CHEAP_ARM} on "
        f"average; per round (greedy off share, hot on off or {CHEAP_ARM}): {history}"
    )


def test_sidecar_sigkill_mid_generation_then_restart(llm: Any, sidecar: SidecarProcess) -> None:
    n, max_tokens = 32, 400
    result: dict[str, Any] = {}

    def generate() -> None:
        result["tokens"], _ = _generate(llm, _prompts(n, 500), _params("greedy", n, max_tokens))

    worker = threading.Thread(target=generate)
    worker.start()
    time.sleep(0.7)
    assert worker.is_alive(), "generation ended before the sidecar was killed"
    sidecar.kill()
    worker.join(timeout=600)
    assert not worker.is_alive()
    assert [len(t) for t in result["tokens"]] == [max_tokens] * n  # every request completed

    # Restart with a different policy: everything off. The engine reconnects by itself.
    sidecar.start(policy="static", config='[policy]\nname = "static"\nparams = { arm = "off" }\n')
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sidecar.metric("specctl_engines_connected") < 1:
        time.sleep(0.2)
    assert sidecar.metric("specctl_engines_connected") >= 1, "the engine did not reconnect"
    # the report of the fallback follows the reconnect; on a loaded machine not at once
    fallback: list[dict[str, Any]] = []
    while not fallback and time.monotonic() < deadline + 30:
        time.sleep(0.2)
        # whole lines only: the sidecar may be writing the last one
        lines = sidecar.log_path.read_text().split("\n")[:-1]
        events = [json.loads(line) for line in lines if line]
        fallback = [e for e in events if e.get("event") == "engine_fallback"]
    assert fallback, "the engine did not report that it ran its fallback arm"
    assert "unreachable" in fallback[0].get("reason", "")

    d0, _ = _spec_counters(llm)
    tokens, _ = _generate(llm, _prompts(8, 700), _params("greedy", 8, 48))
    d1, _ = _spec_counters(llm)
    assert [len(t) for t in tokens] == [48] * 8
    assert d1 == d0, "the engine still drafts: it did not apply the new sidecar's policy"


def _learned(sidecar: SidecarProcess) -> dict[tuple[str, int], tuple[float, dict[str, float]]]:
    """Per (class, bucket) with evidence: effective rounds and the arm probabilities."""
    out = {}
    for ce in sidecar.evidence().classes:
        if ce.rounds > 0:
            out[(ce.workload_class, ce.load_bucket)] = (
                ce.rounds,
                {a.arm: a.probability for a in ce.arms},
            )
    return out


def _wait_connected(sidecar: SidecarProcess) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sidecar.metric("specctl_engines_connected") < 1:
        time.sleep(0.2)
    assert sidecar.metric("specctl_engines_connected") >= 1, "the engine did not reconnect"


def test_sigkill_under_load_then_restart_resumes_the_learned_policy(
    llm: Any, sidecar: SidecarProcess
) -> None:
    state = sidecar.workdir / "state"
    config = f'[state]\ndir = "{state}"\nsnapshot_interval_s = 0.5\nlog_flush_interval_s = 0.2\n'
    sidecar.kill()
    sidecar.start(policy="specctl", config=config)
    _wait_connected(sidecar)
    tokens, _ = _generate(
        llm,
        _prompts(24, 900),
        _params("greedy", 12, 64) + _params("hot", 12, 64, seed0=900),
    )
    assert [len(t) for t in tokens] == [64] * 24
    time.sleep(1.5)  # past a snapshot and a log flush: what a SIGKILL may lose is older
    before = _learned(sidecar)
    assert {c for c, _ in before} >= {"greedy", "hot"}, before

    # Killed while requests are running: none of them fails.
    n, max_tokens = 16, 300
    result: dict[str, Any] = {}

    def generate() -> None:
        result["tokens"], _ = _generate(
            llm,
            _prompts(n, 950),
            _params("greedy", n // 2, max_tokens) + _params("hot", n // 2, max_tokens, seed0=950),
        )

    worker = threading.Thread(target=generate)
    worker.start()
    time.sleep(0.5)
    sidecar.kill()
    worker.join(timeout=600)
    assert [len(t) for t in result["tokens"]] == [max_tokens] * n

    # Restarted without operator action: the learned state is back, not the prior.
    sidecar.start(policy="specctl", config=config)
    _wait_connected(sidecar)
    after = _learned(sidecar)
    for context, (rounds, _) in before.items():
        assert context in after, f"{context} was forgotten across the restart"
        # The snapshot and the log tail bring back at least what was learned before the
        # load that preceded the kill (that load only adds evidence, discounted).
        assert after[context][0] >= 0.5 * rounds, (context, rounds, after[context][0])
    events = [json.loads(line) for line in sidecar.log_path.read_text().splitlines() if line]
    assert any(e.get("event") == "state_restored" for e in events), [
        e.get("event") for e in events
    ][:20]
