"""The weights group over NCCL (runtime.weight_sync: collective with GPUs on both sides),
without Ray: members in threads of this process, one GPU each. With one GPU the group is
rank 0 alone (NCCL refuses two ranks on one device), which still takes the NCCL path:
the group built with the run's timeout, buckets of each dtype on the GPU, the transfer
awaited before its time is taken."""

from __future__ import annotations

import threading

import pytest
import torch

from asyncrlhf.distributed.weights import WeightChannel, layout_of
from asyncrlhf.models import weights_checksum
from tests.helpers import free_port

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed": torch.randn(300, 64, generator=g),
        "norm": torch.randn(64, generator=g).to(torch.bfloat16),
        "head": torch.randn(64, 300, generator=g),
        "steps": torch.arange(6, dtype=torch.int64),
    }


def test_weights_broadcast_over_nccl_arrive_whole_and_in_time():
    world, port, state = min(2, torch.cuda.device_count()), free_port(), _state()
    received: dict[int, dict[str, torch.Tensor]] = {}
    seconds: dict[int, float] = {}
    errors: list[BaseException] = []

    def member(rank: int) -> None:
        try:
            torch.cuda.set_device(rank)
            channel = WeightChannel(
                "127.0.0.1", port, rank, world, layout_of(state), timeout_s=120, keep=2, bucket_mb=0.05, device="cuda"
            )
            assert channel.device == f"cuda:{rank}" and len(channel.buckets) > 2  # several buckets, one dtype each
            if rank == 0:
                channel.stage(1, {k: v.cuda() for k, v in state.items()})  # staged on the host
                assert all(t.device.type == "cpu" for t in channel.versions[1].values())
                seconds[rank] = channel.send(1)
                received[rank] = channel.versions[1]
            else:
                seconds[rank] = channel.receive(1)
                received[rank] = channel.wait(1)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert sorted(received) == list(range(world)) and all(s > 0 for s in seconds.values())
    for got in received.values():
        assert weights_checksum(got) == weights_checksum(state)
        assert all(got[k].dtype == v.dtype and torch.equal(got[k], v) for k, v in state.items())
