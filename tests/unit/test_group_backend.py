"""Which backend a group's own process group asks torch for (issue 53): from torch 2.15
plain "nccl" is the new nccl2 implementation, which Phalanx has not run with, so CUDA
groups name the legacy one wherever torch registers it by name."""

from __future__ import annotations

import torch.distributed as dist

from trainer.parallel.mesh import group_backend

TORCH_2_13 = ["undefined", "gloo", "nccl", "xccl", "ucc", "mpi", "fake"]
TORCH_2_15 = [*TORCH_2_13, "nccl2", "nccl-legacy"]


def test_cuda_groups_name_the_legacy_nccl_where_torch_has_the_name() -> None:
    assert group_backend("cuda", TORCH_2_15) == "cpu:gloo,cuda:nccl-legacy"


def test_before_torch_2_15_plain_nccl_is_the_legacy_one() -> None:
    assert group_backend("cuda", TORCH_2_13) == "cpu:gloo,cuda:nccl"


def test_cpu_groups_use_gloo_whatever_torch_registers() -> None:
    assert group_backend("cpu", TORCH_2_15) == "gloo" == group_backend("cpu", TORCH_2_13)


def test_the_installed_torch_registers_every_backend_chosen() -> None:
    for device in ("cpu", "cuda"):
        chosen = group_backend(device, dist.Backend.backend_list)
        names = [part.split(":")[-1] for part in chosen.split(",")]
        assert all(n in dist.Backend.backend_list for n in names), (device, chosen)
