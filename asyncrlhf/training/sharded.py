"""The trainer as one rank of a group joined by ``torch.distributed`` (FSDP2 or DDP).

Every rank holds the whole batch (token ids are small) and runs the same program: the
same mini-batch order, the same rows skipped, the same loss. Only the forward and
backward passes are split: each rank computes the log-probs of its share of the rows
(balanced by tokens), and the shares are summed into the batch's [B, R] log-probs on
every rank, this rank's rows carrying their graph. The loss is then computed over the
whole batch exactly as in one process, whatever its aggregation (token mean, sequence
mean, Dr. GRPO's constant) and whatever statistics it takes over the batch (M2PO's
mask, the trust region's budget, the clip fraction): nothing per objective needs a
global count of its own. Backward sends each rank's gradient through its own rows; the
group's gradient reduction sums them, so one update of N ranks is the one-process
update up to float rounding (``tests/training/test_sharded.py`` checks it for every
registered objective and aggregation, at 2 and 4 ranks with unequal tokens per rank).

Every rank must take part in every forward and backward (FSDP2 gathers each layer's
parameters then): a rank whose share of a mini-batch is empty runs one row with a zero
weight. Weights for rollout engines are gathered piece by piece into rank 0 (the other
ranks take part and get nothing), each piece handed on before the next is gathered, and
the held-out evaluation runs on the sharded model, every rank generating together: no
rank ever holds the whole weights beside its shards. Checkpoints are sharded, with
``torch.distributed.checkpoint``, and load onto any number of ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from asyncrlhf.models import PIECE_BYTES, state_buckets, weights_checksum
from asyncrlhf.training.logprobs import prompt_groups, sequence_logprobs
from asyncrlhf.training.lora import adapter_state_dict, is_lora, merge_state
from asyncrlhf.training.safe_dcp import SafeLoadPlanner, SafeReader, check_dcp_folder
from asyncrlhf.training.trainer import TrainerWorker, _select
from asyncrlhf.types import ExperienceBatch

__all__ = ["Parallel", "ShardedTrainer", "shard_rows"]

Parallel = Literal["fsdp", "ddp"]
_WHOLE = StateDictOptions(full_state_dict=True, cpu_offload=True)


def shard_rows(tokens: list[int], world: int, groups: list[int] | None = None) -> list[list[int]]:
    """Rows for each of ``world`` ranks, balanced by ``tokens`` per row: the largest unit
    first to the rank with the fewest tokens so far (ties: the lower rank). A unit is a row,
    or with ``groups`` (a group id per row) every row of a group, kept on one rank: the rows
    of one prompt, which that rank then reads once. Every rank computes the same split."""
    units: dict[int, list[int]] = {}
    for row in range(len(tokens)):
        units.setdefault(row if groups is None else groups[row], []).append(row)
    size = {key: sum(tokens[r] for r in rows) for key, rows in units.items()}
    loads, shares = [0] * world, [[] for _ in range(world)]
    for key in sorted(units, key=lambda k: (-size[k], units[k][0])):
        rank = min(range(world), key=lambda k: (loads[k], k))
        shares[rank] += units[key]
        loads[rank] += size[key]
    return [sorted(share) for share in shares]


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks FSDP2 shards one by one (``model.model.layers`` of a
    ``transformers`` causal LM); none found: the model is sharded whole."""
    inner = model.get_base_model() if is_lora(model) else model
    inner = getattr(inner, "model", inner)
    layers = getattr(inner, "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


def wrap(model: torch.nn.Module, parallel: Parallel, trainable: bool = True) -> torch.nn.Module:
    """``model`` sharded with FSDP2 (per decoder layer, then the root) or replicated with
    DDP, over the default process group; a frozen model (the reference) is sharded the
    same way under FSDP2 and left whole under DDP."""
    if parallel == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        device = "cuda" if next(model.parameters()).is_cuda else "cpu"
        mesh = init_device_mesh(device, (dist.get_world_size(),))
        for layer in _decoder_layers(model):
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    if parallel == "ddp":
        if not trainable:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    raise ValueError(f"parallel must be 'fsdp' or 'ddp', got {parallel!r}")


class ShardedTrainer(TrainerWorker):
    """A :class:`~asyncrlhf.training.TrainerWorker` that is one rank of a trainer group
    (``torch.distributed`` must be initialised): same arguments, plus ``parallel``
    (``"fsdp"``: FSDP2 per decoder layer; ``"ddp"``: a full replica per rank).

    Every rank must make the same calls in the same order: :meth:`step`,
    :meth:`stream_state` and :meth:`state_dict` (which gather the weights), generation
    with :meth:`inference_model`, :meth:`save_sharded` and :meth:`load_sharded`.
    """

    def __init__(self, model: Any, *args: Any, parallel: Parallel = "fsdp", **kwargs: Any) -> None:
        if not dist.is_initialized():
            raise RuntimeError("ShardedTrainer needs torch.distributed initialised (init_process_group) first")
        self.rank, self.world, self.parallel = dist.get_rank(), dist.get_world_size(), parallel
        device = kwargs.get("device")
        model = model.to(device) if device is not None else model
        self.lora = is_lora(model)
        own = model.state_dict()
        published = merge_state(model, own) if self.lora else own
        self._layout = [(k, tuple(v.shape), v.dtype) for k, v in published.items()]
        del own, published
        super().__init__(wrap(model, parallel), *args, **kwargs)
        if self.ref_model is not None:
            self.ref_model = wrap(self.ref_model, parallel, trainable=False)
        self._peft = model  # the model itself (unwrapped): its LoRA layers' scaling, its peft config

    # ------------------------------------------------------ the split batch
    def _logprobs(self, model: Any, batch: ExperienceBatch) -> torch.Tensor:
        """This rank computes its rows; the sum over ranks fills every row once (adding
        zeros is exact), and this rank's rows are put back with their graph. With
        ``share_prompts`` a prompt's rows stay on one rank, which reads the prompt once."""
        tokens = batch.attention_mask.sum(dim=1).tolist()
        groups = prompt_groups(batch)[1].tolist() if self.share_prompts else None
        rows = shard_rows(tokens, self.world, groups)[self.rank]
        mine = torch.tensor(rows if rows else [0], dtype=torch.long, device=batch.input_ids.device)
        # Every rank must make the same forward passes (FSDP2 gathers each layer per pass):
        # sharing always takes its prompt-then-responses path, whatever this rank's rows
        local = sequence_logprobs(model, _select(batch, mine), self.temperature, self.share_prompts, always=True)
        full = torch.zeros(len(batch), batch.response_ids.shape[1], dtype=local.dtype, device=local.device)
        if rows:
            full[mine] = local.detach()
        dist.all_reduce(full)
        if not torch.is_grad_enabled():
            return full
        if not rows:  # an empty share still runs backward: a zero-weighted row
            return full + torch.where(torch.isfinite(local), local, 0.0).sum() * 0.0
        return full.index_put((mine,), local)

    def _backward(self, loss: torch.Tensor) -> None:
        # FSDP2 and DDP average gradients over ranks; each rank's is its rows' part of the sum
        (loss * self.world).backward()

    def _clip_grads(self, max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        full = getattr(norm, "full_tensor", None)  # FSDP2: a DTensor over the shards
        return float(full() if full is not None else norm)

    # ------------------------------------------------------------- weights
    def stream_state(self, bucket_bytes: int = PIECE_BYTES) -> Iterator[dict[str, torch.Tensor]]:
        """The published weights gathered piece by piece, in key order, yielded on rank 0
        (the other ranks take part in every gather and get nothing): rank 0 holds one
        piece beside its shards, never the whole weights. Every rank runs it to the end."""
        if self.lora:  # a merge needs a layer's base weight and adapters together: whole
            state = self.state_dict()
            yield from state_buckets(((k, state[k]) for k in sorted(state)), bucket_bytes)
            return
        shards = get_model_state_dict(self.model)  # DTensors under FSDP2, the replica under DDP
        pieces = ((k, _whole_tensor(shards[k])) for k in sorted(shards))
        if self.rank != 0:
            for _ in pieces:  # take part in the gathers
                pass
            return
        yield from state_buckets(pieces, bucket_bytes)

    def _own_state(self) -> dict[str, torch.Tensor]:
        """The whole weights under the model's own names (with LoRA: its adapters), gathered."""
        state = get_model_state_dict(self.model, options=_WHOLE)
        if self.parallel == "ddp":  # the replica's own tensors, not a gather: copy them
            state = {k: v.detach().clone() for k, v in state.items()}
        return state

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The published weights whole on rank 0 (in the model's order), ``{}`` elsewhere;
        every rank takes part. A publication streams them instead (:meth:`stream_state`)."""
        if self.lora:
            own = self._own_state()
            return merge_state(self._peft, own) if self.rank == 0 else {}
        whole = {k: v for piece in self.stream_state() for k, v in piece.items()}
        return {name: whole[name] for name, _, _ in self._layout} if self.rank == 0 else {}

    def adapter(self) -> dict[str, Any] | None:
        """With LoRA, on rank 0: the peft config and the adapters' weights (gathered)."""
        if not self.lora:
            return None
        own = self._own_state()
        if self.rank != 0:
            return None
        config = self._peft.peft_config["default"].to_dict()
        return {"config": config, "weights": adapter_state_dict(self._peft, own)}

    def checksum(self) -> str:
        state = self.state_dict()
        return weights_checksum(state) if self.rank == 0 else ""

    def weights_layout(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        """The whole weights' (taken before sharding), without a gather."""
        return list(self._layout) if self.rank == 0 else []

    def inference_model(self) -> Any:
        """The live model, on every rank: under FSDP2 sharded, so every rank must generate
        with it together, the same forward passes (:meth:`generation_stop`), each pass
        gathering one layer at a time; under DDP the replica."""
        return self.model.module if self.parallel == "ddp" else self.model

    def generation_stop(self) -> Callable[[torch.Tensor], bool]:
        """Generation stops once every rank's rows are finished (one all-reduce per token,
        as ``synced_gpus`` in ``transformers``): ranks that finish first keep making the
        forward passes the others' gathers need."""

        def everywhere(finished: torch.Tensor) -> bool:
            left = torch.tensor([0 if bool(finished.all()) else 1], device=finished.device)
            dist.all_reduce(left)
            return int(left) == 0

        return everywhere

    # --------------------------------------------------------- checkpoints
    def state(self) -> dict[str, Any]:
        """What one process's :meth:`TrainerWorker.state` holds but the model and the
        optimiser, which :meth:`save_sharded` writes."""
        out = super().state()
        del out["model"], out["optimizer"]
        out["world"] = self.world
        return out

    def restore(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state` (after :meth:`load_sharded`), or a one-process
        :meth:`TrainerWorker.state` (with its whole model and optimiser: each rank keeps
        its shards of them)."""
        if "model" in state:
            if self.lora:
                raise ValueError(
                    "a one-process LoRA checkpoint does not resume onto a trainer group: "
                    "resume it with runtime.trainer.ranks=1"
                )
            optim = _optimizer_by_name(self.optimizer, state["optimizer"], self._names())
            options = StateDictOptions(full_state_dict=True)
            set_state_dict(
                self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=optim, options=options
            )
        self._restore_progress(state)

    def _names(self) -> dict[Any, str]:
        return {p: name.removeprefix("module.") for name, p in self.model.named_parameters()}

    def save_sharded(self, folder: str | Path) -> None:
        """Each rank writes its shards of the model and the optimiser into ``folder`` (with
        LoRA: of the adapters alone; the frozen base comes from the start checkpoint)."""
        model, optim = get_state_dict(self.model, self.optimizer, options=_trained(self.model))
        dcp.save({"model": model, "optimizer": optim}, checkpoint_id=str(folder))

    def load_sharded(self, folder: str | Path) -> None:
        """Read what :meth:`save_sharded` wrote, by any number of ranks."""
        load_shards(self.model, self.optimizer, folder)


def load_shards(model: Any, optimizer: Any, folder: str | Path) -> None:
    """Load what :meth:`ShardedTrainer.save_sharded` wrote into ``model`` and
    ``optimizer``: the shards of any number of ranks resharded onto this group, or read
    whole by one process without a group (a group's run resumed by one trainer). Nothing
    in the folder can run code (:mod:`asyncrlhf.training.safe_dcp`).

    Raises:
        UnsafeCheckpointError: a file of the folder names code.
    """
    check_dcp_folder(folder)  # a clear refusal, before DCP wraps it
    options = _trained(model)
    model_state, optim = get_state_dict(model, optimizer, options=options)
    state = {"model": model_state, "optimizer": optim}
    # DCP's own reader unpickles ``.metadata`` and bytes items unrestricted: ours admits no code
    dcp.load(state, storage_reader=SafeReader(folder), planner=SafeLoadPlanner(), no_dist=not dist.is_initialized())
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"], options=options
    )


def _whole_tensor(t: torch.Tensor) -> torch.Tensor:
    """A state-dict entry whole, on the CPU, in storage of its own: an FSDP2 shard
    all-gathered, a replica's tensor copied (training changes it in place)."""
    full = getattr(t, "full_tensor", None)
    return full().cpu() if full is not None else t.detach().to("cpu", copy=True)


def _trained(model: Any) -> StateDictOptions:
    """What a checkpoint holds: every weight, or with LoRA the trained ones alone."""
    lora = is_lora(getattr(model, "module", model))
    return StateDictOptions(ignore_frozen_params=True, strict=False) if lora else StateDictOptions()


def _optimizer_by_name(optimizer: Any, plain: dict[str, Any], names: dict[Any, str]) -> dict[str, Any]:
    """A one-process ``optimizer.state_dict()`` (its parameters numbered in group order)
    keyed by parameter names instead, as ``set_state_dict`` takes it. Both optimisers are
    built by :class:`TrainerWorker` over the same model, so their groups and order agree."""
    order = [names[p] for group in optimizer.param_groups for p in group["params"]]
    groups = [{**g, "params": [order[i] for i in g["params"]]} for g in plain["param_groups"]]
    return {"state": {order[i]: v for i, v in plain["state"].items()}, "param_groups": groups}
