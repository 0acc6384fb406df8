from __future__ import annotations

import copy
import threading

import pytest
import torch

from asyncrlhf.losses import group_advantages
from asyncrlhf.rollout import HFEngine, Sampling
from asyncrlhf.training import OptimConfig, TrainerWorker, sequence_logprobs
from asyncrlhf.types import Experience, collate
from tests.helpers import even_first_token, small_model

PROMPTS = [torch.tensor([1, 10 + i, 20 + i]) for i in range(4)]
G = 4


def rollout(engine: HFEngine) -> list[Experience]:
    samples = engine.generate(PROMPTS, G)
    ids = torch.nn.utils.rnn.pad_sequence([s.response_ids for s in samples], batch_first=True)
    rewards = even_first_token(ids, None, 2)
    advantages = group_advantages(rewards, G)
    return [
        Experience(s.prompt_ids, s.response_ids, s.logprobs, float(r), s.policy_version, s.prompt_index, float(a))
        for s, r, a in zip(samples, rewards, advantages, strict=True)
    ]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recomputed_logprobs_match_the_engine(temperature, device):
    model, tok = small_model()
    model.to(device)
    engine = HFEngine(
        model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=8, temperature=temperature), seed=1
    )
    experiences = rollout(engine)
    batch = collate(experiences, tok.pad_token_id, device)
    with torch.no_grad():
        recomputed = sequence_logprobs(model, batch, temperature)
    delta = (recomputed - batch.old_logprobs).abs()[batch.response_mask]
    assert delta.max().item() < 1e-4
    trainer = TrainerWorker(model, tok.pad_token_id, "ppo", temperature=temperature)
    metrics = trainer.step(experiences)
    assert metrics["policy/ratio_max"] == pytest.approx(1.0, abs=1e-4)  # the first PPO ratio is 1
    assert metrics["policy/clip_frac"] == 0.0


@pytest.mark.parametrize("algorithm", ["ppo", "m2po", "grpo", "gspo", "decoupled_ppo"])
def test_a_few_steps_change_every_parameter(algorithm, device):
    model, tok = small_model()
    model.to(device)
    before = copy.deepcopy(model.state_dict())
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=2)
    trainer = TrainerWorker(model, tok.pad_token_id, algorithm, optim=OptimConfig(lr=1e-2))
    for _ in range(3):
        trainer.step(rollout(engine))
        engine.load_weights(trainer.state_dict(), trainer.version)
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p, before[name])]
    assert unchanged == []
    assert trainer.version == 3


def test_non_finite_loss_skips_the_step_and_leaves_weights_untouched():
    model, tok = small_model()
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=3)
    experiences = rollout(engine)
    experiences[0].logprobs[0] = float("nan")
    trainer = TrainerWorker(model, tok.pad_token_id, "ppo")
    before = trainer.checksum()
    metrics = trainer.step(experiences)
    assert trainer.checksum() == before
    assert metrics["train/skipped_steps"] == 1.0 and trainer.skipped_steps == 1
    assert trainer.version == 1  # a version per step, even a skipped one (weights equal)


def test_mini_batches_and_epochs():
    model, tok = small_model()
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=4)
    trainer = TrainerWorker(model, tok.pad_token_id, "grpo", optim=OptimConfig(ppo_epochs=2, mini_batches=4, lr=1e-2))
    metrics = trainer.step(rollout(engine))
    assert metrics["train/skipped_updates"] == 0.0
    assert metrics["policy/ratio_max"] > 1.0  # later updates see the policy moved


def test_decoupled_ppo_gets_the_policy_of_the_step_start_as_proximal():
    """On fresh data π_prox = π_behav (weight 1, M2 0 between them); over 8 updates the
    proximal policy stays the step's start, so later updates see π_θ/π_prox move."""
    model, tok = small_model()
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=4)
    trainer = TrainerWorker(
        model, tok.pad_token_id, "decoupled_ppo", optim=OptimConfig(ppo_epochs=2, mini_batches=4, lr=1e-2)
    )
    metrics = trainer.step(rollout(engine))
    assert metrics["policy/m2_behav_prox"] < 1e-8 and metrics["policy/behav_weight_mean"] == pytest.approx(1, abs=1e-4)
    assert metrics["policy/ratio_max"] > 1.0 and metrics["train/skipped_updates"] == 0.0


def test_save_load_continue_equals_not_stopping(tmp_path):
    def setup():  # type: ignore[no-untyped-def]
        model, tok = small_model()
        engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=5)
        optim = OptimConfig(mini_batches=2, lr=1e-2, warmup_updates=8)  # still warming up at the third step
        trainer = TrainerWorker(model, tok.pad_token_id, "grpo", optim=optim, seed=9)
        return engine, trainer

    engine, trainer = setup()
    batches = [rollout(engine) for _ in range(3)]
    trainer.step(batches[0])
    trainer.step(batches[1])
    trainer.save(tmp_path / "ckpt.pt")
    expected = trainer.step(batches[2])

    _, resumed = setup()
    resumed.load(tmp_path / "ckpt.pt")
    assert resumed.version == 2
    got = resumed.step(batches[2])
    assert got["loss/policy"] == expected["loss/policy"]
    # Updates 4 and 5 of the warm-up (the step's mean lr), on both: AdamW's step count is the clock.
    assert got["train/lr"] == expected["train/lr"] == pytest.approx(1e-2 * (5 + 6) / 2 / 8)
    assert resumed.checksum() == trainer.checksum()


def test_the_warm_up_raises_the_learning_rate_linearly_then_holds_it():
    optim = OptimConfig(lr=1e-3, warmup_updates=4)
    assert [optim.lr_at(u) for u in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert OptimConfig(lr=1e-3).lr_at(0) == 1e-3  # none by default
    with pytest.raises(ValueError, match="warmup_updates"):
        OptimConfig(warmup_updates=-1)
    # Then a decay to the floor at total_updates, held there after.
    linear = OptimConfig(lr=1e-3, warmup_updates=2, decay="linear", total_updates=6, min_lr_ratio=0.2)
    assert [linear.lr_at(u) for u in range(8)] == pytest.approx([5e-4, 1e-3, 1e-3, 8e-4, 6e-4, 4e-4, 2e-4, 2e-4])
    cosine = OptimConfig(lr=1e-3, decay="cosine", total_updates=4)
    assert [cosine.lr_at(u) for u in range(5)] == pytest.approx([1e-3, 8.5355e-4, 5e-4, 1.4645e-4, 0.0], abs=1e-8)
    with pytest.raises(ValueError, match="needs total_updates"):
        OptimConfig(warmup_updates=4, decay="cosine", total_updates=4)
    model, tok = small_model()
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=4)
    trainer = TrainerWorker(model, tok.pad_token_id, "grpo", optim=OptimConfig(lr=1e-2, warmup_updates=3))
    lrs = [trainer.step(rollout(engine))["train/lr"] for _ in range(4)]
    assert lrs == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2, 1e-2])
    # A frozen first parameter (no optimiser state) does not stop the clock: once it did.
    model, tok = small_model()
    next(model.parameters()).requires_grad_(False)
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=4)
    trainer = TrainerWorker(model, tok.pad_token_id, "grpo", optim=OptimConfig(lr=1e-2, warmup_updates=3))
    lrs = [trainer.step(rollout(engine))["train/lr"] for _ in range(4)]
    assert lrs == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2, 1e-2])


def test_missing_advantages_and_bad_settings_fail_clearly():
    model, tok = small_model()
    exp = Experience(torch.tensor([1]), torch.tensor([5]), torch.tensor([-1.0]), 1.0, 0, "p")
    with pytest.raises(ValueError, match="advantage"):
        TrainerWorker(model, tok.pad_token_id).step([exp])
    with pytest.raises(ValueError, match="algorithm"):
        TrainerWorker(model, tok.pad_token_id, "dpo")
    with pytest.raises(ValueError, match="unknown options"):
        TrainerWorker(model, tok.pad_token_id, "ppo", {"m2_threshold": 0.1})
    with pytest.raises(ValueError, match="lr"):
        TrainerWorker(model, tok.pad_token_id, optim=OptimConfig(lr=0.0))


def _with_zero_groups(experiences: list[Experience]) -> list[Experience]:
    """The first group's advantages set to 0 (a group that scored alike), the rest kept."""
    return [
        Experience(
            e.prompt_ids,
            e.response_ids,
            e.logprobs,
            e.reward,
            e.policy_version,
            e.prompt_id,
            0.0 if i < G else (e.advantage or 0.5),
        )
        for i, e in enumerate(experiences)
    ]


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "gspo", "decoupled_ppo"])
def test_leaving_out_zero_advantage_rows_gives_the_same_update(algorithm, loss_agg):
    model, tok = small_model()
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=4)
    batch = _with_zero_groups(rollout(engine))
    options = {"loss_agg": loss_agg, **({"norm_length": 6} if loss_agg == "seq-mean-token-sum-norm" else {})}
    if algorithm == "gspo":
        options["clip_eps"], options["clip_eps_high"] = 0.2, 0.2
    results, rows_seen = [], []
    for skip in (False, True):
        copy_ = copy.deepcopy(model)
        copy_.register_forward_pre_hook(lambda _m, _a, kw: rows_seen.append(kw["input_ids"].shape[0]), with_kwargs=True)
        trainer = TrainerWorker(
            copy_,
            tok.pad_token_id,
            algorithm,
            options,
            OptimConfig(lr=1e-2, mini_batches=2),
            seed=5,
            skip_zero_advantage=skip,
        )
        metrics = [trainer.step(batch) for _ in range(2)]
        results.append((metrics, trainer.state_dict()))
    (full, full_weights), (skipped, skipped_weights) = results
    signal = sum(e.advantage != 0 for e in batch) / len(batch)
    # 2 steps × 2 mini-batches (+1 proximal pass per step for decoupled PPO), full rows vs signal rows only.
    assert sum(rows_seen[: len(rows_seen) // 2]) > sum(rows_seen[len(rows_seen) // 2 :])
    for a, b in zip(full, skipped, strict=True):
        assert a["loss/policy"] == pytest.approx(b["loss/policy"], abs=1e-6)
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-5)
        assert a["train/signal_rows"] == b["train/signal_rows"] == pytest.approx(signal)
    for name, value in full_weights.items():
        torch.testing.assert_close(skipped_weights[name], value, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("algorithm", "options"), [("m2po", {}), ("grpo", {"kl_coef": 0.1})])
def test_losses_that_give_zero_advantage_rows_a_term_train_on_every_row(algorithm, options):
    model, tok = small_model()
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=4)
    batch = _with_zero_groups(rollout(engine))
    ref = copy.deepcopy(model) if "kl_coef" in options else None
    rows_seen: list[int] = []
    model.register_forward_pre_hook(lambda _m, _a, kw: rows_seen.append(kw["input_ids"].shape[0]), with_kwargs=True)
    trainer = TrainerWorker(model, tok.pad_token_id, algorithm, options, ref_model=ref)
    assert not trainer.skip_zero_advantage
    trainer.step(batch)
    assert rows_seen[-1] == len(batch)  # the response pass reads every row (the prompts' pass reads each once)


def test_an_all_zero_advantage_batch_still_takes_its_optimiser_step():
    model, tok = small_model()
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=6), seed=4)
    batch = [
        Experience(e.prompt_ids, e.response_ids, e.logprobs, e.reward, e.policy_version, e.prompt_id, 0.0)
        for e in rollout(engine)
    ]
    trainer = TrainerWorker(model, tok.pad_token_id, "grpo", optim=OptimConfig(lr=1e-2))
    trainer.step(_with_zero_groups(rollout(engine)))  # momentum from a batch with signal
    before = trainer.checksum()
    metrics = trainer.step(batch)
    assert metrics["train/signal_rows"] == 0.0 and metrics["loss/policy"] == 0.0
    assert trainer.checksum() != before  # AdamW's momentum moved the weights, as without skipping


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_reading_each_prompt_once_gives_the_log_probs_and_gradients_of_a_pass_over_every_row(temperature):
    model, tok = small_model()
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, sampling=Sampling(max_new_tokens=8), seed=6)
    batch = collate(rollout(engine), tok.pad_token_id)
    assert len(set(map(tuple, batch.input_ids[:, : batch.prompt_width].tolist()))) == len(PROMPTS) < len(batch)
    results = []
    for shared in (True, False):
        model.zero_grad()
        logprobs = sequence_logprobs(model, batch, temperature, share_prompts=shared)
        (logprobs * batch.response_mask).sum().backward()
        results.append((logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (shared_lp, shared_grads), (full_lp, full_grads) = results
    mask = batch.response_mask
    torch.testing.assert_close(shared_lp[mask], full_lp[mask], atol=1e-5, rtol=1e-5)
    for name, grad in full_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4)


def test_reading_each_prompt_once_matches_on_a_qwen2_model_too():
    """The cache gather is the model's own (``batch_select_indices``): checked on a second
    architecture, with prompts of several lengths (left padding) and ragged responses."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = Qwen2ForCausalLM(config)
    prompts = [torch.randint(3, 64, (n,)) for n in (3, 7, 5)]
    experiences = [
        Experience(p, torch.randint(3, 64, (1 + (i + j) % 6,)), torch.zeros(1 + (i + j) % 6), 0.0, 0, i, 0.5)
        for i, p in enumerate(prompts)
        for j in range(4)
    ]
    batch = collate(experiences, pad_token_id=0)
    grads = []
    for shared in (True, False):
        model.zero_grad()
        logprobs = sequence_logprobs(model, batch, 1.0, share_prompts=shared)
        (logprobs * batch.response_mask).sum().backward()
        grads.append((logprobs.detach()[batch.response_mask], [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-5, rtol=1e-5)
    for a, b in zip(grads[0][1], grads[1][1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_the_shared_prompt_gradient_is_bit_identical_with_another_thread_busy():
    """Reading each prompt once gathers its KV cache for its rows; transformers' own gather
    (advanced indexing) adds the rows' gradients back with atomic float adds across
    threads, so two lagged runs at 2 threads parted at step 4 (~1e-7). The gather is
    ``index_select`` now: 30 repeats with a second thread busy, as the rollout side is,
    give one gradient bit for bit (the old gather gave 30 different ones)."""
    from asyncrlhf.models import SHIPPED_POLICY, load_pretrained

    model, tokenizer = load_pretrained(SHIPPED_POLICY)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 20, (7,), generator=g) for _ in range(64)]
    experiences = [
        Experience(p, torch.randint(4, 20, (5,), generator=g), torch.zeros(5), 0.0, 0, i, 1.0)
        for i, p in enumerate(prompts)
        for _ in range(8)
    ][3:-2]  # groups split unevenly across threads, as after leaving zero-advantage rows out
    batch = collate(experiences, tokenizer.pad_token_id)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    stop = threading.Event()

    def busy() -> None:
        x = torch.randn(300, 300)
        while not stop.is_set():
            x @ x

    def gradient() -> torch.Tensor:
        model.zero_grad()
        (sequence_logprobs(model, batch) * batch.response_mask).sum().backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    other = threading.Thread(target=busy)
    other.start()
    try:
        reference = gradient()
        differing = sum(not torch.equal(gradient(), reference) for _ in range(30))
    finally:
        stop.set()
        other.join()
        torch.set_num_threads(previous)
    assert differing == 0
