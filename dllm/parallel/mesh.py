"""A 2-D process mesh for decoding: LoPA branch ranks x tensor-parallel ranks.

``world = branch_size x tensor_size``. Rank ``r`` sits at branch rank ``b = r // tensor_size`` and
tensor rank ``t = r % tensor_size`` (``r = b * tensor_size + t``: the tensor ranks of one model replica
are consecutive, so on one node a replica's shards sit on neighbouring devices). Two families of process
groups, built with :func:`torch.distributed.device_mesh.init_device_mesh` and ``mesh_dim_names``
``("branch", "tensor")``:

* the **tensor group** of replica ``b``: ranks ``{b T, ..., b T + T - 1}``. The replica's layers are
  sharded over it (``dllm.parallel.tensor.shard_model(model, group=mesh.tensor_group)``); its
  ``all_reduce`` calls (two per layer) stay inside it;
* the **branch group** of tensor slice ``t``: ranks ``{t, T + t, ..., (B - 1) T + t}``. LoPA's branch
  protocol (``dllm.decoding.lopa.branch_parallel``) runs over it: the group's first rank (branch rank 0)
  broadcasts each round and gathers the compact results of the other replicas' ranks that hold the same
  tensor slice.

Every tensor rank of replica 0 runs the LoPA control loop alike (the LM head is replicated, so their logits
are identical) and drives its own branch group; every tensor rank of replica ``b > 0`` serves its branch
group's requests, forwarding through its replica's tensor group. Each rank thus joins collectives on its
own two groups only, in the same order as the other members of each group.

A mesh of ``1 x T`` is plain tensor parallelism, ``B x 1`` plain branch parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class ProcessMesh:
    """Where the calling rank sits on a ``branch_size x tensor_size`` mesh, and its two process groups."""

    branch_size: int
    tensor_size: int
    rank: int
    branch_group: object
    tensor_group: object
    device_mesh: object = None

    @property
    def branch_rank(self) -> int:
        return self.rank // self.tensor_size

    @property
    def tensor_rank(self) -> int:
        return self.rank % self.tensor_size


def mesh_rank(branch_rank: int, tensor_rank: int, tensor_size: int) -> int:
    """The global rank at ``(branch_rank, tensor_rank)``: ``branch_rank * tensor_size + tensor_rank``."""
    return branch_rank * tensor_size + tensor_rank


def init_mesh(branch_size: int, tensor_size: int, device: str | None = None) -> ProcessMesh:
    """Build the mesh's process groups on every rank of the initialised default group (call on every rank).

    ``device``: ``cuda...`` builds the groups on CUDA (NCCL), anything else on CPU (gloo). Raises a
    ``ValueError`` unless the world size is ``branch_size * tensor_size``.
    """
    if branch_size < 1 or tensor_size < 1:
        raise ValueError(f"mesh sizes must be >= 1, got branch {branch_size} x tensor {tensor_size}")
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("a process mesh needs an initialised torch.distributed process group")
    world = dist.get_world_size()
    if world != branch_size * tensor_size:
        raise ValueError(f"a {branch_size} x {tensor_size} mesh (branch x tensor) needs {branch_size * tensor_size} "
                         f"ranks; the process group has {world}")
    from torch.distributed.device_mesh import init_device_mesh

    device_type = "cuda" if device is not None and str(device).startswith("cuda") else "cpu"
    mesh = init_device_mesh(device_type, (branch_size, tensor_size), mesh_dim_names=("branch", "tensor"))
    return ProcessMesh(branch_size, tensor_size, dist.get_rank(), branch_group=mesh.get_group("branch"),
                       tensor_group=mesh.get_group("tensor"), device_mesh=mesh)
