"""Loading checkpoints without unpickling anything: DCP metadata through an allow-list
unpickler, and a planner that refuses any pickled (non-tensor) item."""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import ReadItem


class _AllowListUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata: DCP's own classes (dataclasses, enums) and torch value types only."""

    CLASS_MODULES = ("torch.distributed.checkpoint.", "torch.distributed._shard.")
    NAMED: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        {
            ("torch", "Size"),
            ("torch.serialization", "_get_layout"),  # how torch pickles a torch.layout
            ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"),
            ("collections", "OrderedDict"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        plain = module in ("torch", "torch.serialization", "pathlib", "collections")
        found = (
            super().find_class(module, name)
            if plain or module.startswith(self.CLASS_MODULES)
            else None
        )
        record = isinstance(found, type) and (
            dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)
        )
        if module.startswith(self.CLASS_MODULES) and record:
            return found
        if (module, name) in self.NAMED or (module == "torch" and isinstance(found, torch.dtype)):
            return found
        raise pickle.UnpicklingError(
            f"checkpoint metadata refers to {module}.{name}, which is not allowed"
        )


class SafeReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with (Path(self.path) / ".metadata").open("rb") as f:
            metadata = _AllowListUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata  # type: ignore[no-any-return]


class TensorOnlyPlanner(DefaultLoadPlanner):
    """Phalanx checkpoints hold only tensors; a pickled item is refused, never unpickled."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise RuntimeError(
            f"checkpoint item {read_item.dest_index.fqn} is pickled data; refusing to load it"
        )
