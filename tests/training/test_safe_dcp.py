"""A trainer group's checkpoint (a torch.distributed.checkpoint folder) cannot run code
when it is read: its ``.metadata`` pickle admits DCP's own classes only, its bytes items
plain values only."""

from __future__ import annotations

import io
import os
import pickle
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from asyncrlhf.training.safe_dcp import SafeLoadPlanner, UnsafeCheckpointError, read_metadata
from asyncrlhf.training.sharded import load_shards


class Payload:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.target}",))


def _saved(folder) -> torch.optim.Optimizer:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    optim.step()
    state, optim_state = get_state_dict(model, optim)
    dcp.save({"model": state, "optimizer": optim_state}, checkpoint_id=str(folder), no_dist=True)
    return model


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_issue_reproduction_runs_nothing(tmp_path):
    target = tmp_path / "PWNED"
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / ".metadata").write_bytes(pickle.dumps(Payload(str(target))))
    model = torch.nn.Linear(2, 2)
    with pytest.raises(UnsafeCheckpointError, match=r"names posix\.system, which a checkpoint may not hold"):
        load_shards(model, torch.optim.AdamW(model.parameters()), tmp_path / "x")
    assert not target.exists()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_real_checkpoint_still_loads_whole(tmp_path):
    saved = _saved(tmp_path / "ck")
    model = torch.nn.Linear(3, 2)
    optim = torch.optim.AdamW(model.parameters(), lr=5e-3)  # the checkpoint's 1e-3 replaces it
    load_shards(model, optim, tmp_path / "ck")
    assert torch.equal(model.weight, saved.weight) and torch.equal(model.bias, saved.bias)
    assert optim.param_groups[0]["lr"] == 1e-3 and optim.param_groups[0]["betas"] == (0.9, 0.999)
    assert float(optim.state_dict()["state"][0]["step"]) == 1.0
    assert len(read_metadata(tmp_path / "ck" / ".metadata").state_dict_metadata) > 5


def test_metadata_that_is_not_dcp_s_is_refused(tmp_path):
    (tmp_path / "a").write_bytes(pickle.dumps({"plain": 1}))
    with pytest.raises(UnsafeCheckpointError, match="holds a dict, not a checkpoint's metadata"):
        read_metadata(tmp_path / "a")
    (tmp_path / "b").write_bytes(b"garbage")
    with pytest.raises(UnsafeCheckpointError, match="not a checkpoint's metadata"):
        read_metadata(tmp_path / "b")


def test_a_bytes_item_with_code_is_refused(tmp_path):
    """DCP's default planner reads bytes items (the optimiser's plain values) with
    ``weights_only=False``; ours with ``weights_only=True``."""
    target = tmp_path / "PWNED"
    buffer = io.BytesIO()
    torch.save(Payload(str(target)), buffer)
    buffer.seek(0)
    planner = SafeLoadPlanner()
    item = SimpleNamespace(dest_index=SimpleNamespace(fqn="optimizer.param_groups.0.lr"))
    with pytest.raises(UnsafeCheckpointError, match=r"'optimizer\.param_groups\.0\.lr' holds more than plain values"):
        planner.load_bytes(item, buffer)
    assert not target.exists()
