"""A trainer group's update is the one-process update: every registered objective and
aggregation, at 2 and 4 ranks (gloo, one process each), FSDP2 and DDP, float64 and
float32, each prompt read once per rank (a prompt's rows on one rank) or every row whole,
with unequal tokens per rank, a rank whose share of a mini-batch is empty, and
micro-batches."""

from __future__ import annotations

import copy
import datetime
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrlhf.losses import group_advantages, policy_losses
from asyncrlhf.models import TinyModelConfig, build_char_tokenizer, build_tiny_model, weights_checksum
from asyncrlhf.rollout import HFEngine, Sampling
from asyncrlhf.training import OptimConfig, TrainerWorker
from asyncrlhf.training.sharded import shard_rows
from asyncrlhf.types import Experience
from tests.helpers import even_first_token, free_port, spawn_ranks

TWO_LAYERS = TinyModelConfig(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=40
)
PROMPTS = [torch.tensor([1, 10 + i, 20 + i][: 2 + i % 2]) for i in range(5)]
G = 2
DR = {"loss_agg": "seq-mean-token-sum-norm", "norm_length": 10}
# (name, objective, options, optim, skip_zero_advantage, reference)
CASES: list[tuple[str, str, dict[str, Any], dict[str, Any], bool, bool]] = [
    ("ppo", "ppo", {}, {}, False, False),
    ("ppo-seq", "ppo", {"loss_agg": "seq-mean-token-mean"}, {}, False, False),
    ("ppo-dr", "ppo", DR, {}, False, False),
    ("grpo", "grpo", {"loss_agg": "seq-mean-token-mean"}, {}, False, False),
    ("grpo-kl", "grpo", {"kl_coef": 0.1}, {}, False, True),
    ("grpo-dr-minibatches", "grpo", DR, {"mini_batches": 2, "ppo_epochs": 2}, True, False),
    ("gspo", "gspo", {"clip_eps": 0.2, "clip_eps_high": 0.2, "loss_agg": "seq-mean-token-mean"}, {}, False, False),
    ("decoupled", "decoupled_ppo", {}, {"ppo_epochs": 2}, False, False),
    ("decoupled-seq", "decoupled_ppo", {"loss_agg": "seq-mean-token-mean", "behav_cap": 2.0}, {}, True, False),
    ("m2po-batch", "m2po", {"m2_threshold": 0.001}, {}, False, False),
    ("m2po-token", "m2po", {"mode": "token", "m2_threshold": 1.5}, {}, False, False),
    ("m2po-trust", "m2po", {"mode": "trust_region", "m2_threshold": 0.0005}, {"mini_batches": 3}, False, False),
    # micro-batches: each rank splits every micro-batch by tokens too (4 ranks: 2 with nothing)
    ("m2po-batch-micro", "m2po", {"m2_threshold": 0.001}, {"micro_batch_size": 2}, False, False),
    ("grpo-dr-micro", "grpo", DR, {"mini_batches": 2, "micro_batch_size": 3}, True, False),
]


def test_the_cases_cover_every_registered_objective_and_aggregation():
    assert {case[1] for case in CASES} == set(policy_losses())
    aggs = {case[2].get("loss_agg", "token-mean") for case in CASES}
    assert aggs == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
    assert {case[2].get("mode", "batch") for case in CASES if case[1] == "m2po"} == {"batch", "token", "trust_region"}


def test_rows_are_shared_by_tokens_and_every_row_goes_to_one_rank():
    assert shard_rows([5, 1, 1, 1, 4, 2], 2) == [[0, 1, 2], [3, 4, 5]]  # 7 tokens each: longest first
    # a prompt's rows stay together: groups of 6, 4 and 4 tokens
    assert shard_rows([3, 1, 3, 2, 2, 1, 1, 1], 2, [0, 1, 0, 2, 2, 1, 1, 1]) == [[0, 2], [1, 3, 4, 5, 6, 7]]
    shares = shard_rows([3, 3], 4)
    assert shares == [[0], [1], [], []]
    tokens = [7, 1, 9, 2, 2, 8, 3, 5, 5, 1]
    for world in (1, 2, 3, 4):
        shares = shard_rows(tokens, world)
        assert sorted(r for share in shares for r in share) == list(range(len(tokens)))


def _batch(model: Any, tokenizer: Any) -> list[Experience]:
    """Responses of unequal lengths (1 to 10 tokens), behaviour log-probs from a
    perturbed copy of the model (ratios ≠ 1, so clipping and masks act), one group
    scored alike (zero advantages)."""
    behaviour = copy.deepcopy(model)
    with torch.no_grad():
        for p in behaviour.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype))
    engine = HFEngine(behaviour, tokenizer.eos_token_id, tokenizer.pad_token_id, Sampling(max_new_tokens=10), seed=3)
    samples = engine.generate(PROMPTS, G)
    for i, s in enumerate(samples):  # lengths 1 to 10: an untrained model never stops early
        n = 1 + (i * 7) % 10
        s.response_ids, s.logprobs = s.response_ids[:n], s.logprobs[:n]
    ids = torch.nn.utils.rnn.pad_sequence([s.response_ids for s in samples], batch_first=True)
    rewards = even_first_token(ids, None, 2)
    rewards[:G] = 1.0
    advantages = group_advantages(rewards, G)
    return [
        Experience(s.prompt_ids, s.response_ids, s.logprobs, float(r), 0, s.prompt_index, float(a))
        for s, r, a in zip(samples, rewards, advantages, strict=True)
    ]


def _trainer(cls: type, model: Any, tokenizer: Any, case: tuple, **extra: Any) -> Any:
    _, objective, options, optim, skip, reference = case
    return cls(
        model,
        tokenizer.pad_token_id,
        objective,
        options,
        OptimConfig(lr=1e-2, **optim),
        ref_model=copy.deepcopy(model) if reference else None,
        seed=5,
        skip_zero_advantage=skip,
        **extra,
    )


def _model(dtype: torch.dtype) -> tuple[Any, Any]:
    tokenizer = build_char_tokenizer()
    return build_tiny_model(tokenizer, TWO_LAYERS, seed=1).to(dtype), tokenizer


def _rank(
    rank: int, world: int, port: int, parallel: str, dtype: torch.dtype, out: str, device: str, share: bool
) -> None:
    import torch.distributed as dist

    from asyncrlhf.training.sharded import ShardedTrainer

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=120)
    backend = "gloo"
    if device == "cuda":  # a GPU per rank, as on a cluster
        torch.cuda.set_device(rank)
        device, backend = f"cuda:{rank}", "nccl"
    dist.init_process_group(backend, f"tcp://127.0.0.1:{port}", timeout=timeout, world_size=world, rank=rank)
    try:
        model, tokenizer = _model(dtype)
        batch = _batch(model, tokenizer)
        results = {}
        for case in CASES:
            trainer = _trainer(
                ShardedTrainer,
                copy.deepcopy(model),
                tokenizer,
                case,
                parallel=parallel,
                device=device,
                share_prompts=share,
            )
            metrics = [trainer.step(batch) for _ in range(_steps(dtype))]
            results[case[0]] = (metrics, trainer.state_dict(), _grads(trainer.model))
        results["whole"] = _whole_model_use(trainer, tokenizer)
        if rank == 0:
            torch.save(results, out)
        dist.barrier()  # no rank tears down while another still talks to it
    finally:
        dist.destroy_process_group()
    # Leave without running C++ static destructors: once in the suite on CI (not in 40
    # runs here, idle or loaded) a rank aborted after its work with gloo's "terminate
    # called without an active exception", a thread still joinable at exit
    os._exit(0)


def _whole_model_use(trainer: Any, tokenizer: Any) -> dict[str, Any]:
    """What a publication and an evaluation see (the last case's trainer): the layout, the
    streamed pieces (rank 0's; none elsewhere) with their checksum, and greedy responses
    from every rank generating together on the sharded model; then again with rank 1's
    one row finishing at its first token (its EOS made that token) while rank 0's go on:
    rank 1 must keep making the passes rank 0's gathers need."""
    from asyncrlhf.models import Checksum

    checksum, pieces = Checksum(), []
    for piece in trainer.stream_state(bucket_bytes=4096):
        checksum.update(piece)
        pieces.append(list(piece))
    model, stop = trainer.inference_model(), trainer.generation_stop()
    greedy = _greedy(model, tokenizer, stop)
    early = {"prompts": PROMPTS[:1], "eos": greedy[0][0]} if trainer.rank == 1 else {}
    return {
        "layout": trainer.weights_layout(),
        "pieces": pieces,
        "streamed": checksum.hexdigest(),
        "checksum": trainer.checksum(),
        "greedy": greedy,
        "greedy_again": _greedy(model, tokenizer, stop, **early),
    }


def _greedy(
    model: Any, tokenizer: Any, stop: Any = None, prompts: list[torch.Tensor] = PROMPTS, eos: int | None = None
) -> list[list[int]]:
    sampling = Sampling(max_new_tokens=8, temperature=0.0)
    eos = tokenizer.eos_token_id if eos is None else eos
    engine = HFEngine(model, eos, tokenizer.pad_token_id, sampling, copy=False, stop=stop)
    return [s.response_ids.tolist() for s in engine.generate(prompts)]


def _grads(model: Any) -> dict[str, torch.Tensor]:
    """The last update's gradient (after clipping), whole (FSDP2 holds DTensor shards)."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            out[name.removeprefix("module.")] = grad.detach().to("cpu", copy=True)
    return out


def _steps(dtype: torch.dtype) -> int:
    """Two steps in float64, one in float32. The gradients then agree within the
    tolerance; the weights in float32 within 1e-4 only: AdamW's first step is lr·g/(|g| +
    eps), so a gradient element near eps = 1e-8 turns float32 rounding into up to 2e-5
    (measured: one element of 2048, decoupled PPO), as reading the rows in another order
    does in one process."""
    return 2 if dtype == torch.float64 else 1


def _group(
    world: int, parallel: str, dtype: torch.dtype, tmp_path: Path, device: str = "cpu", share: bool = True
) -> dict[str, Any]:
    out = str(tmp_path / f"{world}-{parallel}.pt")
    spawn_ranks(_rank, world, free_port(), parallel, dtype, out, device, share)
    return torch.load(out, weights_only=False, map_location="cpu")


# NCCL takes one GPU per rank: on a machine with one, the group is rank 0 alone
GPU_WORLD = max(1, min(2, torch.cuda.device_count()))
ON_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]


@pytest.mark.parametrize(
    ("world", "parallel", "dtype", "tol", "device", "share"),
    [
        (2, "fsdp", torch.float64, 1e-6, "cpu", True),
        (4, "fsdp", torch.float64, 1e-6, "cpu", True),
        (2, "ddp", torch.float64, 1e-6, "cpu", True),
        (2, "fsdp", torch.float32, 1e-5, "cpu", True),
        (2, "fsdp", torch.float64, 1e-6, "cpu", False),
        pytest.param(GPU_WORLD, "fsdp", torch.float32, 1e-5, "cuda", True, marks=ON_GPU, id="nccl-fsdp"),
        pytest.param(GPU_WORLD, "ddp", torch.float32, 1e-5, "cuda", True, marks=ON_GPU, id="nccl-ddp"),
    ],
)
def test_a_group_update_equals_the_one_process_update(world, parallel, dtype, tol, device, share, tmp_path):
    torch.set_num_threads(1)
    model, tokenizer = _model(dtype)
    batch = _batch(model, tokenizer)
    tokens = [e.prompt_ids.numel() + e.response_ids.numel() for e in batch]
    assert len(set(tokens)) > 2  # unequal rows, so unequal shares
    group = _group(world, parallel, dtype, tmp_path, device, share)
    for case in CASES:
        # The same reading as the group's: each prompt once or every row whole (the two round
        # differently, which AdamW turns into up to 1.4e-6 on a weight whose gradient is near 0)
        trainer = _trainer(TrainerWorker, copy.deepcopy(model), tokenizer, case, share_prompts=share, device=device)
        metrics = [trainer.step(batch) for _ in range(_steps(dtype))]
        sharded_metrics, sharded_state, sharded_grads = group[case[0]]
        for one, many in zip(metrics, sharded_metrics, strict=True):
            assert one.keys() == many.keys(), case[0]
            for key, value in one.items():
                assert many[key] == pytest.approx(value, rel=tol, abs=tol), (case[0], key)
        state = {k: v.cpu() for k, v in trainer.state_dict().items()}
        assert state.keys() == sharded_state.keys()
        moved = max(float((state[k] - model.state_dict()[k]).abs().max()) for k in state)
        assert moved > 1e-3, case[0]  # the update did something to compare
        grads = _grads(trainer.model)
        assert grads.keys() == sharded_grads.keys()
        weights = tol if dtype == torch.float64 else 1e-4
        for name, (ours, theirs, atol) in {
            "grad": (sharded_grads, grads, tol),
            "weight": (sharded_state, state, weights),
        }.items():
            for key, value in theirs.items():
                label = f"{case[0]}: {name} {key}"
                torch.testing.assert_close(
                    ours[key], value, atol=atol, rtol=tol, msg=lambda m, label=label: f"{label}: {m}"
                )
    # Rank 0 streams the weights in pieces of about 4 KB, in key order, whose checksum is
    # the whole state's; the ranks evaluate together on the sharded model, as one process
    whole = group["whole"]
    assert whole["layout"] == [(k, tuple(v.shape), v.dtype) for k, v in state.items()]
    names = [name for piece in whole["pieces"] for name in piece]
    assert names == sorted(state) and len(whole["pieces"]) > 5
    assert whole["streamed"] == whole["checksum"] == weights_checksum(sharded_state)
    assert whole["greedy"] == whole["greedy_again"] == _greedy(trainer.model, tokenizer)
    assert trainer.device.type == device  # the one process trained where the group did


def test_a_sharded_trainer_needs_a_process_group():
    from asyncrlhf.training.sharded import ShardedTrainer

    model, tokenizer = _model(torch.float32)
    if not os.environ.get("WORLD_SIZE"):
        with pytest.raises(RuntimeError, match="init_process_group"):
            ShardedTrainer(model, tokenizer.pad_token_id)
