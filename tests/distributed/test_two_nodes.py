"""Multi-node, simulated on this machine: a real Ray cluster of a head and a second node,
each a separate ``ray start --block`` process with one CPU and a resource of its own; a
run joins it through ``runtime.address`` (in a subprocess: the suite's other tests share
an in-process cluster) and places a 2-rank trainer one rank per node (strict_spread) with
a rollout actor beside one of them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.pipelines.conftest import REPO

RAY = Path(sys.executable).with_name("ray")
# Ray 2.5x turns token authentication on for a head started by `ray start`; the simulated
# cluster lives on loopback for the test's length, so it runs without
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}
OVERRIDES = [
    "runtime.kind=ray",
    "runtime.torch_threads=1",
    "runtime.trainer.ranks=2",
    "runtime.trainer.placement=strict_spread",
    "runtime.trainer.num_cpus=0.5",
    "runtime.rollout.num_cpus=0.5",
    "rollout.workers=1",
    "trainer.batch_size=32",
    "task.eval_size=10",
    "orchestrator.eval_every=2",
]


def drive(address: str, steps: int) -> None:
    """In the subprocess: join the cluster, run, print where every rank ran."""
    import ray

    from asyncrlhf.distributed import ray_runtime
    from pipelines.run import build_runtime
    from pipelines.spec import load_spec

    spec = load_spec(REPO / "experiments" / "quickstart.yaml", [*OVERRIDES, f"runtime.address={address}"])
    with ray_runtime(spec.runtime.address):
        runtime = build_runtime(spec)
        try:
            history = runtime.run(steps)
            nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
            placement = [{**rank, "resources": nodes[rank["node"]]} for rank in runtime.trainer.placement]
            out = {
                "placement": placement,
                "summary": history.summary,
                "rewards": [s["reward/mean"] for s in history.steps],
            }
        finally:
            runtime.close()
    print("RESULT " + json.dumps(out))


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(RAY), "start", "--block", "--num-cpus", "1", "--object-store-memory", str(200 << 20), *args],
            env=ENV,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed whole at the end
        )


def _stop(procs: list[subprocess.Popen[bytes]], grace_s: float = 5.0) -> None:
    """End both nodes: SIGTERM to each node's process group, then SIGKILL to what is left
    after ``grace_s``. `ray start --block` takes SIGTERM but its graceful stop hangs here
    (its GCS server and raylet still ran 30 s on; the suite waited that out per node), and
    every process of a node is in its group, so the kill leaves nothing behind."""
    for proc in reversed(procs):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group's children too, if its leader already exited
        proc.wait(timeout=30)


@pytest.fixture
def two_nodes() -> Iterator[str]:
    temp = Path(tempfile.mkdtemp(prefix="r2n", dir="/tmp"))  # short: Ray's socket paths have a length limit
    address = f"127.0.0.1:{free_port()}"
    procs = [
        _start(
            [
                "--head",
                "--port",
                address.split(":")[1],
                "--node-ip-address",
                "127.0.0.1",
                "--include-dashboard=false",
                "--temp-dir",
                str(temp),
                "--resources",
                '{"node_a": 1}',
            ],
            temp / "head.log",
        )
    ]
    try:
        _wait_for(address, 1, procs)
        procs.append(
            _start(
                ["--address", address, "--node-ip-address", "127.0.0.1", "--resources", '{"node_b": 1}'],
                temp / "worker.log",
            )
        )
        _wait_for(address, 2, procs)
        yield address
    finally:
        _stop(procs)
        shutil.rmtree(temp, ignore_errors=True)


def _wait_for(address: str, nodes: int, procs: list[subprocess.Popen[bytes]], timeout_s: float = 90) -> None:
    """Until ``ray status`` lists ``nodes`` active nodes (or a node process has exited)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a ray node exited with {[p.poll() for p in procs]}")
        status = subprocess.run(
            [str(RAY), "status", "--address", address], env=ENV, capture_output=True, text=True, timeout=30
        )
        if status.stdout.count(" node_") >= nodes:
            return
        time.sleep(1)
    raise TimeoutError(f"{nodes} ray nodes did not come up within {timeout_s}s")


def test_a_two_rank_trainer_runs_one_rank_on_each_of_two_nodes(two_nodes):
    code = f"from tests.distributed.test_two_nodes import drive; drive({two_nodes!r}, 4)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    placement = sorted(result["placement"], key=lambda r: r["rank"])
    assert [r["rank"] for r in placement] == [0, 1]
    assert len({r["node"] for r in placement}) == 2  # strict_spread: one rank per node
    assert {name for r in placement for name in r["resources"] if name.startswith("node_")} == {"node_a", "node_b"}
    assert result["summary"]["trainer/nodes"] == 2.0 and result["summary"]["trainer/ranks"] == 2.0
    assert len(result["rewards"]) == 4 and all(0.0 <= r <= 1.0 for r in result["rewards"])
