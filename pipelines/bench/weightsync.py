"""Weight sync time against model size: the object store (one ``ray.put``, every rollout
actor's ``ray.get``) against a broadcast over the weights process group (gloo), from the
sender holding a version to every receiver holding a copy it can load (both paths copy
into the receiver's own tensors, as an engine's load does).

Members are Ray actors on a local cluster (one sender, ``receivers`` receivers), the
weights a model-like list of float32 tensors of the given total size.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

__all__ = ["run"]


def _state(parameters: int, pieces: int = 48) -> dict[str, torch.Tensor]:
    size = parameters // pieces
    return {
        f"layer{i}.weight": torch.randn(size + (parameters - size * pieces if i == 0 else 0)) for i in range(pieces)
    }


class _Member:
    def __init__(self, parameters: int) -> None:
        torch.set_num_threads(1)
        self.state = _state(parameters)
        self.channel: Any = None

    def endpoint(self) -> tuple[str, int, Any]:
        from asyncrlhf.distributed.resources import node_endpoint
        from asyncrlhf.distributed.weights import layout_of

        return *node_endpoint(), layout_of(self.state)

    def join(self, host: str, port: int, rank: int, world: int, layout: Any) -> None:
        from asyncrlhf.distributed.weights import WeightChannel

        self.channel = WeightChannel(host, port, rank, world, layout, timeout_s=300.0, keep=1)

    def put(self) -> list[Any]:
        import ray

        return [ray.put(self.state)]

    def get(self, refs: list[Any]) -> None:
        import ray

        for name, tensor in ray.get(refs[0]).items():
            self.state[name].copy_(tensor)

    def send(self, version: int) -> None:
        self.channel.stage(version, self.state)
        self.channel.send(version)

    def receive(self, version: int) -> None:
        self.channel.receive(version)
        for name, tensor in self.channel.wait(version).items():
            self.state[name].copy_(tensor)


def _measure(parameters: int, receivers: int, repeats: int) -> dict[str, list[float]]:
    import ray

    member = ray.remote(num_cpus=0)(_Member)
    sender, *others = [member.remote(parameters) for _ in range(1 + receivers)]
    try:
        host, port, layout = ray.get(sender.endpoint.remote())
        world = 1 + receivers
        joins = [m.join.remote(host, port, rank, world, layout) for rank, m in enumerate([sender, *others])]
        ray.get(joins)
        out: dict[str, list[float]] = {"object_store": [], "collective": []}
        for version in range(repeats + 1):  # the first of each is a warm-up
            start = time.perf_counter()
            refs = ray.get(sender.put.remote())
            ray.get([m.get.remote(refs) for m in others])
            store = time.perf_counter() - start
            del refs
            start = time.perf_counter()
            ray.get([sender.send.remote(version), *[m.receive.remote(version) for m in others]])
            collective = time.perf_counter() - start
            if version:
                out["object_store"].append(store)
                out["collective"].append(collective)
        return out
    finally:
        for m in [sender, *others]:
            ray.kill(m)


def run(sizes: list[int], receivers: int = 2, repeats: int = 3) -> dict[int, dict[str, dict[str, float]]]:
    """Per size (parameters): each path's seconds (median, min, max) and their ratio."""
    from asyncrlhf.distributed import ray_runtime

    results: dict[int, dict[str, dict[str, float]]] = {}
    with ray_runtime(num_cpus=2):
        for parameters in sizes:
            times = _measure(parameters, receivers, repeats)
            ratio = [c / s for c, s in zip(times["collective"], times["object_store"], strict=True)]
            results[parameters] = {
                name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                for name, v in {**times, "collective_vs_store": ratio}.items()
            }
    return results
