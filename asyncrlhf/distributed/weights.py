"""Weights to rollout actors over a ``torch.distributed`` process group.

The object store path (``ray.put`` once per version, every rollout actor fetching it) is
simple and fast for small models on one node; for large models every peer broadcasts over
a process group instead. Here trainer rank 0 and the rollout actors form a group of their
own (gloo on CPU, NCCL where the members hold GPUs), beside the trainer's, over a
``TCPStore`` that rank 0 hosts:

* at each publication rank 0 stages a copy of the gathered weights (training goes on
  while it is sent) and the driver starts one broadcast of it: rank 0 sends, every
  rollout actor receives, each in a thread of its own (a Ray concurrency group), so
  neither training nor generation waits for it;
* the weights travel as flat buckets of one dtype (``bucket_mb``); the receiver rebuilds
  the state dict from the layout it was given when it joined and verifies its checksum
  when it loads, as on the object-store path;
* every collective has the run's timeout: a member that never comes fails the broadcast,
  and the run, loudly.

Both ends keep the last ``keep`` versions (the ring a lagged schedule needs), so a
checkpoint reads them from rank 0 and a rollout call finds its exact version.
"""

from __future__ import annotations

import datetime
import threading
from collections import OrderedDict
from typing import Any

import torch

__all__ = ["Layout", "WeightChannel", "choose_sync", "layout_of"]

Layout = list[tuple[str, tuple[int, ...], torch.dtype]]
# "auto" picks the process group from 1 GiB. Measured on one node (2 cores, 2 receivers,
# `asyncrlhf bench --suite full --case weight_sync`), the broadcast is as fast or faster
# at every size (0.46× the object store's time at 0.35M parameters, 0.9× at 10M-100M); below
# 1 GiB both take under a second, and the object store lets a dead rollout actor restart.
AUTO_BYTES = 1 << 30


def layout_of(state: dict[str, torch.Tensor]) -> Layout:
    return [(name, tuple(t.shape), t.dtype) for name, t in state.items()]


def choose_sync(mode: str, nbytes: int) -> str:
    """``"object_store"`` or ``"collective"`` for ``mode`` (``"auto"``: by the weights' size)."""
    if mode == "auto":
        return "collective" if nbytes >= AUTO_BYTES else "object_store"
    if mode not in ("object_store", "collective"):
        raise ValueError(f"weight_sync must be 'auto', 'object_store' or 'collective', got {mode!r}")
    return mode


def _buckets(layout: Layout, bucket_bytes: int) -> list[list[int]]:
    """Indices of ``layout`` in buckets of one dtype, each up to ``bucket_bytes`` (a
    larger tensor is a bucket of its own)."""
    out: list[list[int]] = []
    open_: dict[torch.dtype, tuple[list[int], int]] = {}
    for i, (_, shape, dtype) in enumerate(layout):
        size = torch.Size(shape).numel() * dtype.itemsize
        members, used = open_.get(dtype, ([], 0))
        if members and used + size > bucket_bytes:
            out.append(members)
            members, used = [], 0
        open_[dtype] = ([*members, i], used + size)
    out.extend(members for members, _ in open_.values() if members)
    return out


class WeightChannel:
    """One member's end of the weights group (rank 0: the trainer; 1..W: rollout actors).

    Args:
        host, port: where rank 0 hosts the group's ``TCPStore``.
        rank, world: this member and the group's size.
        layout: the weights' names, shapes and dtypes, in order.
        timeout_s: every collective's limit.
        keep: versions kept (rank 0: to send and checkpoint; the others: to load).
        bucket_mb: the size of one broadcast.
        device: where buckets travel: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL, every member
            holding a GPU).
    """

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world: int,
        layout: Layout,
        timeout_s: float,
        keep: int,
        bucket_mb: float = 256.0,
        device: str = "cpu",
    ) -> None:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, port, world, rank == 0, timeout=timeout, wait_for_workers=False)
        prefixed = dist.PrefixStore("asyncrlhf-weights", self.store)
        if device == "cpu":
            self.group: Any = dist.ProcessGroupGloo(prefixed, rank, world, timeout)
        else:  # the run's timeout, not NCCL's default (10 min): a member that never comes fails the run
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(prefixed, rank, world, options)
        self.device = f"cuda:{torch.cuda.current_device()}" if device == "cuda" else "cpu"
        self.rank, self.layout, self.timeout, self.keep = rank, layout, timeout, keep
        self.buckets = _buckets(layout, int(bucket_mb * 2**20))
        self.versions: OrderedDict[int, dict[str, torch.Tensor]] = OrderedDict()
        self.changed = threading.Condition()
        self.error: BaseException | None = None

    def stage(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Rank 0: keep a copy of ``version``'s weights to send (and checkpoint)."""
        self._keep(version, {k: v.detach().to("cpu", copy=True) for k, v in state.items()})

    def send(self, version: int) -> float:
        """Rank 0: broadcast a staged version; the seconds it took."""
        return self._broadcast(self.versions[version])

    def receive(self, version: int) -> float:
        """Rollout actors: take the broadcast of ``version``; the seconds it took. A
        failure is kept for :meth:`wait` to raise."""
        state = {name: torch.empty(shape, dtype=dtype) for name, shape, dtype in self.layout}
        try:
            seconds = self._broadcast(state)
        except BaseException as error:
            with self.changed:
                self.error = error
                self.changed.notify_all()
            raise
        self._keep(version, state)
        return seconds

    def wait(self, version: int) -> dict[str, torch.Tensor]:
        """Rollout actors: the weights of ``version`` once received (the group's timeout)."""
        with self.changed:
            ready = self.changed.wait_for(
                lambda: version in self.versions or self.error is not None, self.timeout.total_seconds()
            )
            if self.error is not None:
                raise RuntimeError(f"receiving weights failed: {self.error}") from self.error
            if not ready:
                raise TimeoutError(f"weights of version {version} did not arrive within {self.timeout}")
            return self.versions[version]

    def _keep(self, version: int, state: dict[str, torch.Tensor]) -> None:
        with self.changed:
            self.versions[version] = state
            while len(self.versions) > self.keep:
                self.versions.popitem(last=False)
            self.changed.notify_all()

    def _broadcast(self, state: dict[str, torch.Tensor]) -> float:
        import time

        import torch.distributed as dist

        start = time.perf_counter()
        tensors = list(state.values())
        for bucket in self.buckets:
            members = [tensors[i] for i in bucket]
            if self.rank == 0:
                flat = torch.cat([t.reshape(-1) for t in members]).to(self.device)
            else:
                flat = torch.empty(sum(t.numel() for t in members), dtype=members[0].dtype, device=self.device)
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.timeout = 0, self.timeout
            self.group.broadcast([flat], opts).wait()
            if flat.is_cuda:  # NCCL's wait() only orders the streams: the seconds are the transfer's
                torch.cuda.current_stream(flat.device).synchronize()
            if self.rank != 0:
                offset = 0
                for t in members:
                    t.copy_(flat[offset : offset + t.numel()].view(t.shape))
                    offset += t.numel()
        return time.perf_counter() - start


def nbytes(layout: Layout) -> int:
    return sum(torch.Size(shape).numel() * dtype.itemsize for _, shape, dtype in layout)


def in_thread(method: Any) -> Any:
    """An actor method called in the actor's ``weights`` thread (its concurrency group)."""
    return method.options(concurrency_group="weights")


class WeightBroadcasts:
    """The driver's side of the weights group: it forms the group, starts one broadcast
    per published version (rank 0 sends, each rollout actor receives, all in their
    ``weights`` threads), raises a failed one and keeps how long each send took.

    Args:
        endpoint: what rank 0's ``weights_endpoint`` returned (host, port, layout).
        trainer: trainer rank 0's actor handle.
        actors: the rollout actors' handles (ranks 1..W of the group).
        options: ``timeout_s``, ``keep``, ``device`` for every member's channel.
    """

    def __init__(self, endpoint: tuple[str, int, Layout], trainer: Any, actors: list[Any], options: dict[str, Any]):
        import ray

        host, port, layout = endpoint
        self.trainer, self.actors, world = trainer, actors, 1 + len(actors)
        joins = [in_thread(trainer.join_weights).remote(host, port, world, layout, options)]
        joins += [
            in_thread(a.join_weights).remote(host, port, i + 1, world, layout, options) for i, a in enumerate(actors)
        ]
        ray.get(joins, timeout=options["timeout_s"])
        self.sends: list[Any] = []
        self.receives: list[Any] = []
        self.receivers: dict[Any, int] = {}  # a receive's rollout actor, by its reference
        self.seconds: list[float] = []

    def publish(self, version: int) -> None:
        self.sends.append(in_thread(self.trainer.send_weights).remote(version))
        refs = [in_thread(a.receive_weights).remote(version) for a in self.actors]
        self.receives.extend(refs)
        self.receivers.update({ref: i for i, ref in enumerate(refs)})

    def check(self) -> None:
        """Raise the error of a broadcast that failed (a member gone, the timeout)."""
        import ray

        for refs, keep in ((self.sends, True), (self.receives, False)):
            if refs:
                done, rest = ray.wait(refs, num_returns=len(refs), timeout=0)
                refs[:] = rest
                values = [self._value(ref) for ref in done]
                if keep:
                    self.seconds.extend(values)

    def _value(self, ref: Any) -> Any:
        import ray

        index = self.receivers.pop(ref, None)
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as error:
            who = f"rollout-{index}" if index is not None else "trainer rank 0"
            raise RuntimeError(
                f"{who} died; with runtime.weight_sync 'collective' its group cannot take a restarted process: "
                "the run stops here and resumes from its last checkpoint"
            ) from error

    def summary(self) -> dict[str, float]:
        self.check()
        seconds = self.seconds
        return {"weights/collective": 1.0, "weights/broadcast_s": sum(seconds) / max(len(seconds), 1)}
