"""Reading a ``torch.distributed.checkpoint`` folder without running anything in it.

A trainer group's checkpoint is a DCP folder: ``.metadata`` (a pickle of DCP's own
dataclasses: which tensor lies where in which file) and ``__<rank>_<n>.distcp`` files
(tensors, read by DCP with ``torch.load(weights_only=True)``, and "bytes" items, which
DCP's default planner reads with ``torch.load(weights_only=False)``). A pickle can name
any importable callable and have it called while it is read (``os.system`` through
``__reduce__``), so torch's stock reader runs whatever a crafted checkpoint holds.

Here ``.metadata`` goes through an unpickler that finds only the classes DCP writes
there (and torch's size, dtype and layout helpers, and ``pathlib`` paths); anything else
it names is refused before it is built. Bytes items (the optimiser's plain values:
learning rate, betas, flags, parameter names) are read with ``weights_only=True``, which
admits containers, numbers, strings and tensors only. We keep DCP's format rather than
write our own: it is what reshards a group's checkpoint onto any number of ranks.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata

__all__ = ["SafeLoadPlanner", "SafeReader", "UnsafeCheckpointError", "check_dcp_folder", "read_metadata"]

# (module, name) a DCP ``.metadata`` pickle may name: what torch's writer puts there.
_METADATA = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    (_METADATA, name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name: torch.strided
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}


class UnsafeCheckpointError(ValueError):
    """A checkpoint file names code (a callable or class it is not allowed to hold)."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)  # torch.float32 and the like: values, not code
        raise UnsafeCheckpointError(
            f"it names {module}.{name}, which a checkpoint may not hold (its metadata is DCP's own classes only)"
        )


def read_metadata(path: str | Path) -> Metadata:
    """A DCP ``.metadata`` file, unpickled with only DCP's metadata classes admitted.

    Raises:
        UnsafeCheckpointError: the file names anything else (nothing it names is called),
            or it is not DCP metadata.
    """
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except UnsafeCheckpointError as err:
        raise UnsafeCheckpointError(f"{path}: {err}") from None
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as err:
        raise UnsafeCheckpointError(f"{path}: not a checkpoint's metadata ({type(err).__name__}: {err})") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"{path}: holds a {type(metadata).__name__}, not a checkpoint's metadata")
    return metadata


class SafeReader(FileSystemReader):
    """DCP's file-system reader with :func:`read_metadata` in place of ``pickle.load``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        from torch.distributed.checkpoint.metadata import StorageMeta

        metadata = read_metadata(self._get_metadata_path(kwargs.get("rank")))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading bytes items with ``weights_only=True``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            fqn = read_item.dest_index.fqn
            raise UnsafeCheckpointError(f"checkpoint item {fqn!r} holds more than plain values: {err}") from None
        _set_loaded(self, read_item, loaded)


def _set_loaded(planner: DefaultLoadPlanner, read_item: Any, value: Any) -> None:
    """Where :meth:`DefaultLoadPlanner.load_bytes` puts what it read."""
    from torch.distributed.checkpoint._traverse import set_element

    fqn = read_item.dest_index.fqn
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[fqn], value)
    else:
        planner.state_dict[fqn] = value


def check_dcp_folder(folder: str | Path) -> None:
    """Refuse a DCP folder whose metadata (global, or a rank's ``__<rank>.metadata``)
    names code, before anything loads it (DCP would wrap the refusal in its own errors).

    Raises:
        UnsafeCheckpointError: as :func:`read_metadata`, or no metadata at all.
    """
    found = sorted(Path(folder).glob("*.metadata")) + sorted(Path(folder).glob(".metadata"))
    if not found:
        raise UnsafeCheckpointError(f"{folder}: no checkpoint metadata (.metadata) in it")
    for path in found:
        read_metadata(path)
