"""In-flight weight updates: per-token versions from the engine to the trainer's metrics,
the exact variant's planned switches (reproducible, resumable) and the async rule."""

from __future__ import annotations

import copy

import pytest
import torch

from asyncrlhf.models import token_logprobs
from asyncrlhf.orchestration import Schedule
from asyncrlhf.orchestration.schedule import token_staleness
from asyncrlhf.rollout import HFEngine, InFlight, LatencyModelEngine, Sampling
from asyncrlhf.rollout.stub import LongTailLatencyEngine
from asyncrlhf.types import Experience, collate
from tests.helpers import small_model
from tests.orchestration.test_checkpoint import curves, saved
from tests.orchestration.test_orchestrator import build

PROMPTS = [torch.tensor([1, 5, 6]), torch.tensor([1, 7])]


def two_models():  # type: ignore[no-untyped-def]
    old, tok = small_model(seed=0)
    new, _ = small_model(seed=3)
    return old, new, tok


def switching_engine(recompute: bool, at: int = 3):  # type: ignore[no-untyped-def]
    """An engine on ``old`` that loads ``new`` (version 1) before response position ``at``."""
    old, new, tok = two_models()
    engine = HFEngine(old, tok.eos_token_id, tok.pad_token_id, Sampling(max_new_tokens=8), seed=0)
    engine.eos_token_id = -1  # never stops early: every row reaches the switch

    def before(position: int) -> None:
        if position == at:
            engine.load_weights(new.state_dict(), version=1)

    return engine, new, InFlight(before, recompute_kv=recompute)


def teacher_forced(model, sample) -> torch.Tensor:  # type: ignore[no-untyped-def]
    ids = torch.cat([sample.prompt_ids, sample.response_ids])[None]
    logits = model(input_ids=ids).logits[0, sample.prompt_ids.shape[0] - 1 : -1]
    return token_logprobs(logits, sample.response_ids, 1.0)


@pytest.mark.parametrize("recompute", [False, True])
def test_an_engine_switching_in_flight_tags_every_token_with_its_version(recompute):
    engine, new, inflight = switching_engine(recompute)
    plain, _, _ = switching_engine(recompute)
    switched, unswitched = engine.generate(PROMPTS, 2, inflight), plain.generate(PROMPTS, 2)
    for sample, before in zip(switched, unswitched, strict=True):
        assert sample.token_versions.tolist() == [0, 0, 0, 1, 1, 1, 1, 1] and sample.policy_version == 0
        # the tokens before the switch are the old weights' own, drawn from the same stream
        assert torch.equal(sample.response_ids[:3], before.response_ids[:3])
        assert torch.allclose(sample.logprobs[:3], before.logprobs[:3], atol=1e-6)
    with torch.no_grad():
        gaps = [(teacher_forced(new, s)[3:] - s.logprobs[3:]).abs().max().item() for s in switched]
    if recompute:  # every token after the switch is the new weights' exactly
        assert max(gaps) < 1e-5
    else:  # the new weights read the old weights' KV cache: the first new tokens differ from a fresh pass
        assert max(gaps) > 1e-3


def test_an_experience_checks_its_token_versions():
    args = (torch.tensor([1]), torch.tensor([4, 5, 6]), torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="one version per response token"):
        Experience(*args, policy_version=0, prompt_id="p", token_versions=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="oldest token"):
        Experience(*args, policy_version=1, prompt_id="p", token_versions=torch.tensor([0, 1, 1]))
    mixed = Experience(*args, policy_version=2, prompt_id="p", token_versions=torch.tensor([2, 2, 3]))
    whole = Experience(*args[:2], torch.zeros(3), 0.0, policy_version=3, prompt_id="q")
    assert mixed.mixed and not whole.mixed
    batch = collate([mixed, Experience(args[0], torch.tensor([4]), torch.zeros(1), 0.0, 3, "r")], pad_token_id=0)
    assert batch.token_versions.tolist() == [[2, 2, 3], [3, 3, 3]]  # padding: the row's version
    metrics = token_staleness([mixed, whole], version=4)
    assert metrics == {"staleness/token_mean": (2 + 2 + 1 + 1 + 1 + 1) / 6, "staleness/token_max": 2.0,
                       "staleness/mixed_frac": 0.5}  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"mode": "sync", "inflight": True}, "needs mode 'async' or 'lagged'"),
        ({"mode": "lagged", "lag": 1, "inflight": True}, "strictly increasing"),
        ({"mode": "lagged", "lag": 1, "inflight": True, "switch_at": (2, 2)}, "strictly increasing"),
        ({"mode": "lagged", "lag": 1, "inflight": True, "switch_at": (1, 3)}, "at most lag"),
        ({"mode": "async", "inflight": True, "switch_at": (2,)}, "exact variant"),
        ({"mode": "async", "switch_at": (2,)}, "options of inflight"),
    ],
)
def test_bad_inflight_schedules_are_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        Schedule(**fields)


def test_an_engine_that_cannot_pause_is_refused():
    class Whole(LatencyModelEngine):
        updates_in_flight = False

    from asyncrlhf.orchestration import Orchestrator

    sample = build("lagged", lag=1, inflight=True, switch_at=(2,))
    engine = Whole(0.0, vocab_size=16, max_new_tokens=4)
    with pytest.raises(ValueError, match="inflight: Whole cannot load weights between decode steps"):
        Orchestrator(engine, sample.trainer, sample.config)


def recording(orchestrator):  # type: ignore[no-untyped-def]
    """Keep every batch the trainer is given."""
    batches: list[list[Experience]] = []
    step = orchestrator.trainer.step

    def keep(experiences):  # type: ignore[no-untyped-def]
        batches.append(list(experiences))
        return step(experiences)

    orchestrator.trainer.step = keep
    return batches


def test_the_exact_variant_switches_at_the_planned_positions():
    orchestrator = build("lagged", lag=2, inflight=True, switch_at=(1, 3))
    batches = recording(orchestrator)
    history = orchestrator.run(6)
    for n, batch in enumerate(batches):
        planned = [max(0, n - 2), max(0, n - 1), max(0, n - 1), max(0, n)]  # positions 0, 1–2, 3
        for e in batch:
            assert e.versions().tolist() == planned[: e.response_ids.shape[0]]
            assert e.policy_version == max(0, n - 2)  # the oldest token bounds the sequence
    late = history.steps[-1]
    assert late["staleness/max"] == 2.0 and late["staleness/token_max"] <= 2.0
    assert 0.0 < late["staleness/token_mean"] < 2.0 and late["staleness/mixed_frac"] > 0.5
    assert "rollout/logprob_gap" in history.steps[0]  # step 1 trains version 0's data at version 0


def test_the_exact_variant_is_bit_reproducible_and_resumes_exactly():
    fields = {"lag": 2, "inflight": True, "switch_at": (2,), "recompute_kv": True}
    reference = build("lagged", **fields).run(8)
    again = build("lagged", **fields).run(8)
    assert curves(again) == curves(reference) and again.steps[-1]["loss/policy"] == reference.steps[-1]["loss/policy"]
    assert again.staleness == reference.staleness
    resumed = build("lagged", **fields)
    resumed.restore(saved(build("lagged", **fields), after=3))
    history = resumed.run(8)
    assert curves(history) == curves(reference)
    tokens = ("staleness/token_mean", "staleness/mixed_frac")
    assert [[s[k] for k in tokens] for s in history.steps] == [[s[k] for k in tokens] for s in reference.steps]


def streaming(engine, **fields):  # type: ignore[no-untyped-def]
    from asyncrlhf.orchestration import Orchestrator

    sample = build("async", inflight=True, **fields)
    return Orchestrator(engine, sample.trainer, sample.config)


def long_tail(seconds_per_token: float = 0.001):  # type: ignore[no-untyped-def]
    return LongTailLatencyEngine(seconds_per_token, median=3, vocab_size=16, max_new_tokens=32, seed=0)


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
def test_async_in_flight_streams_groups_within_the_bound_by_construction(max_staleness):
    orchestrator = streaming(long_tail(), max_staleness=max_staleness, chunk_tokens=2)
    batches = recording(orchestrator)
    history = orchestrator.run(8)
    experiences = [e for batch in batches for e in batch]
    assert all(bool((e.versions().diff() >= 0).all()) for e in experiences)  # versions only move forward
    for version, batch in enumerate(batches):
        assert all(version - e.policy_version <= max_staleness for e in batch)  # by the oldest token
        assert {e.prompt_id for e in batch} == {f"g{version * 4 + i}:0" for i in range(4)}  # reserved for this step
    stats = orchestrator.buffer.stats()
    assert stats["evicted_stale"] == 0 and stats["dropped_overflow"] == 0
    if max_staleness:
        assert any(e.mixed for e in experiences)  # some responses span a weight update
    assert max(s["staleness/token_max"] for s in history.steps) <= max_staleness
    lengths = [e.response_ids.shape[0] for e in experiences]
    assert max(lengths) > 4 * sorted(lengths)[len(lengths) // 2]  # a long tail, none dropped for it


def test_a_streaming_run_resumes_with_its_pool_and_loses_nothing():
    state = saved(streaming(long_tail(0.02), max_staleness=1, chunk_tokens=2), after=3)
    assert state["stream"]["groups"]  # groups were being generated at the checkpoint
    resumed = streaming(long_tail(0.02), max_staleness=1, chunk_tokens=2)
    resumed.restore(state)
    batches = recording(resumed)
    history = resumed.run(8)
    assert len(history.steps) == 8
    trained = [e.prompt_id for batch in batches for e in batch]
    assert sorted(set(trained)) == sorted({f"g{i}:0" for i in range(12, 32)})  # steps 4–8: each group once
    assert len(trained) == 5 * 16
    stats = resumed.buffer.stats()
    assert stats["pushed"] == stats["sampled"] + stats["size"] and stats["evicted_stale"] == 0


def test_the_hf_engine_streams_too():
    orchestrator = build("async", max_staleness=1, inflight=True, chunk_tokens=2)
    history = orchestrator.run(4)
    assert len(history.steps) == 4 and max(s["staleness/max"] for s in history.steps) <= 1.0


def test_in_flight_data_trains_with_per_token_ratios():
    """A mixed-version row's behaviour log-probs are each its own token's: the trainer's
    ratio is 1 on the tokens the trainer's version sampled, whatever the rest."""
    engine, new, inflight = switching_engine(recompute=True)
    samples = engine.generate(PROMPTS, 2, inflight)
    from asyncrlhf.losses import compute_decoupled_ppo_loss, compute_m2po_loss

    with torch.no_grad():
        current = torch.stack([teacher_forced(new, s) for s in samples])  # the trainer is at version 1
    old = torch.stack([s.logprobs for s in samples])
    versions = torch.stack([s.token_versions for s in samples])
    ratio = (current - old).exp()
    assert torch.allclose(ratio[versions == 1], torch.ones(()), atol=1e-4)
    assert (ratio[versions == 0] - 1).abs().max() > 1e-2  # the old version's tokens are off-policy
    _, metrics = compute_decoupled_ppo_loss(current, old, torch.ones(4), prox_logprobs=copy.copy(current))
    assert metrics["behav_weight_max"] > 1.0 + 1e-3
    # M2PO's second moment is over every token's own log-ratio: the stale tokens carry all of it
    _, m2po = compute_m2po_loss(current, old, torch.ones(4), mode="batch", m2_threshold=1e9)
    log_ratio = current - old
    assert m2po["m2"] == pytest.approx(float(log_ratio.square().mean()), rel=1e-5)
    assert float(log_ratio[versions == 1].square().sum()) < 1e-6 * float(log_ratio.square().sum())
