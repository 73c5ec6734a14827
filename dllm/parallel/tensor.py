"""Tensor parallelism for decoding: every rank holds a slice of each transformer layer.

:func:`shard_model` turns a loaded dllm model (any family: LLaDA, Dream, SDAR, Fast-dLLM v2,
LLaDA-MoE, LLaDA2, SDAR-MoE) into the shard of the calling rank, in place:

* **column-parallel** (output features sliced per rank): q, k and v (or the fused q/k/v projection:
  its q, k and v parts each sliced), the MLP gate and up projections;
* **row-parallel** (input features sliced): the attention output and the MLP down projection; each
  rank's partial output is summed with one ``all_reduce`` and a bias, if any, is added once after it;
* **heads**: rank ``r`` keeps q heads ``[r H/n, (r+1) H/n)`` and KV heads ``[r K/n, (r+1) K/n)``.
  Contiguous ranges keep every q head with its KV head under GQA (q head ``i`` reads KV head
  ``i // (H/K)``); the layers' head counts and ``model.spec`` are set to the local ones, so
  ``model.allocate_cache`` allocates only the local KV heads;
* **mixture of experts**: every expert (and every shared expert) is sharded like a dense MLP (gate/up
  columns, down rows) and the MoE block's combined output (routed experts plus the shared experts
  inside the block) is summed with one ``all_reduce``. The router runs replicated on the replicated
  hidden state, so every rank picks the same experts. LLaDA-MoE's shared expert sits beside the block
  and reduces its own output: a third ``all_reduce`` in those layers;
* **replicated**: the embedding, the norms (q/k norms are per head, so they need no slicing), the
  router and the LM head. This is the *gathered head* choice: every rank computes the identical full
  logits, so no logits, argmax or confidence is ever exchanged and each rank runs the unchanged
  decoding loop on the same numbers. The price is the head's weights and FLOPs on every rank.

Per layer the ranks exchange two ``all_reduce`` of hidden-size activations ``[batch, slots, hidden]``
(attention output, MLP output) and nothing else. The shard is for inference (decoding): the
``all_reduce`` is not differentiable. Heads, KV heads and every MLP width must divide by the
world size; :func:`shard_model` raises a :class:`ValueError` naming the numbers otherwise (a KV head
is never replicated here).

Under ``torchrun`` (``dllm generate --tensor-parallel N``), :func:`init_from_env` starts the process
group from the environment (gloo on CPU, NCCL on CUDA). With ``--branch-parallel`` too, each LoPA branch
replica is sharded over its own tensor group of a :mod:`dllm.parallel.mesh` (``shard_model(model, group=...)``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dllm.modeling.layers import DecoderLayer
from dllm.modeling.moe import SwiGLU


@dataclass(frozen=True)
class TensorParallelInfo:
    """Where a shard sits: ``model.tensor_parallel`` after :func:`shard_model`."""

    rank: int
    world_size: int
    group: object = None


class RowParallelLinear(nn.Linear):
    """A linear layer holding input features ``[r n_in/n, (r+1) n_in/n)``: ``all_reduce(x_r W_r^T) + b``.

    Registered under the original projection's name, so the tensor names do not change.
    """

    group = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, world: int, group=None) -> RowParallelLinear:
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features = linear.in_features // world
        new.out_features = linear.out_features
        new.weight = nn.Parameter(_cols(linear.weight, rank, world), requires_grad=linear.weight.requires_grad)
        if linear.bias is not None:
            new.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=linear.bias.requires_grad)
        else:
            new.register_parameter("bias", None)
        new.group = group
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        return out if self.bias is None else out + self.bias


def _rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return t.detach().index_select(0, index.to(t.device)).clone()


def _cols(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = t.shape[1] // world
    return t.detach()[:, rank * n:(rank + 1) * n].clone()


def _slice_out(linear: nn.Linear, index: torch.Tensor) -> None:
    """Keep output features ``index`` of ``linear`` (column parallel), in place."""
    linear.weight = nn.Parameter(_rows(linear.weight, index), requires_grad=linear.weight.requires_grad)
    if linear.bias is not None:
        linear.bias = nn.Parameter(_rows(linear.bias, index), requires_grad=linear.bias.requires_grad)
    linear.out_features = len(index)


def _slice_in(linear: nn.Linear, rank: int, world: int) -> None:
    """Keep input features of rank ``rank`` (row parallel, no reduce: the caller reduces), in place."""
    if linear.bias is not None:
        raise ValueError("a row-parallel projection reduced by its block cannot carry a bias")
    linear.weight = nn.Parameter(_cols(linear.weight, rank, world), requires_grad=linear.weight.requires_grad)
    linear.in_features //= world


def _span(rank: int, world: int, total: int) -> torch.Tensor:
    n = total // world
    return torch.arange(rank * n, (rank + 1) * n)


def _plain(module: nn.Module, what: str) -> nn.Linear:
    if type(module) is not nn.Linear:
        raise ValueError(f"tensor parallelism shards plain nn.Linear projections; {what} is "
                         f"{type(module).__name__} (merge adapters into the weights first)")
    return module


def _swiglu_widths(module: nn.Module) -> list[tuple[str, int]]:
    return [(f"{name or 'mlp'} width", m.gate_proj.out_features)
            for name, m in module.named_modules() if isinstance(m, SwiGLU)]


def _layer_parts(layer: DecoderLayer) -> tuple[nn.Module | None, list[SwiGLU]]:
    """(the MoE block or None, the SwiGLU modules of the layer outside that block)."""
    block = layer._m("mlp") if layer.has_mlp_module else None
    return block, [child for child in layer.children() if isinstance(child, SwiGLU) and child is not block]


def check_divisible(model: nn.Module, world: int) -> None:
    """Raise a ValueError naming the numbers unless heads, KV heads and every MLP width divide by ``world``."""
    layers = list(model._blocks())
    if not layers or not all(isinstance(layer, DecoderLayer) for layer in layers):
        raise ValueError(f"tensor parallelism needs a dllm model built from DecoderLayer ({type(model).__name__})")
    sizes = {"attention heads": layers[0].num_heads, "KV heads": layers[0].num_kv_heads}
    for i, layer in enumerate(layers):
        block, outside = _layer_parts(layer)
        if block is None:
            sizes[f"layer {i} MLP width"] = _plain(layer._m("gate"), f"layer {i} gate").out_features
        else:
            for what, width in _swiglu_widths(block):
                sizes[f"layer {i} {what}"] = width
        for j, swiglu in enumerate(outside):
            sizes[f"layer {i} shared expert {j} width"] = swiglu.gate_proj.out_features
    bad = {k: v for k, v in sizes.items() if v % world}
    if bad:
        listed = ", ".join(f"{k} = {v}" for k, v in bad.items())
        raise ValueError(f"tensor parallelism over {world} ranks needs the attention heads, KV heads and MLP "
                         f"widths to divide by {world}; not divisible: {listed}")


def _reduce_hook(group):
    def hook(module, args, output):
        dist.all_reduce(output, op=dist.ReduceOp.SUM, group=group)
        return output
    return hook


def _shard_swiglu(m: SwiGLU, rank: int, world: int) -> None:
    index = _span(rank, world, m.gate_proj.out_features)
    _slice_out(_plain(m.gate_proj, "an expert gate_proj"), index)
    _slice_out(_plain(m.up_proj, "an expert up_proj"), index)
    _slice_in(_plain(m.down_proj, "an expert down_proj"), rank, world)


def _shard_layer(layer: DecoderLayer, rank: int, world: int, group) -> None:
    heads, kv, hd = layer.num_heads, layer.num_kv_heads, layer.head_dim
    q_index = _span(rank, world, heads * hd)  # heads are contiguous hd-wide runs of output features
    kv_index = _span(rank, world, kv * hd)
    if layer.names.qkv:
        fused = _plain(layer._m("qkv"), "the fused qkv projection")
        _slice_out(fused, torch.cat([q_index, heads * hd + kv_index, (heads + kv) * hd + kv_index]))
    else:
        _slice_out(_plain(layer._m("q"), "q"), q_index)
        _slice_out(_plain(layer._m("k"), "k"), kv_index)
        _slice_out(_plain(layer._m("v"), "v"), kv_index)
    _replace(layer, layer.names.o, RowParallelLinear.from_linear(_plain(layer._m("o"), "o"), rank, world, group))
    layer.num_heads, layer.num_kv_heads = heads // world, kv // world
    block, outside = _layer_parts(layer)
    if block is None:
        index = _span(rank, world, layer._m("gate").out_features)
        _slice_out(layer._m("gate"), index)
        _slice_out(_plain(layer._m("up"), "up"), index)
        down = _plain(layer._m("down"), "down")
        _replace(layer, layer.names.down, RowParallelLinear.from_linear(down, rank, world, group))
    else:
        for m in block.modules():
            if isinstance(m, SwiGLU):
                _shard_swiglu(m, rank, world)
        block.register_forward_hook(_reduce_hook(group))  # after the routed and in-block shared experts combine
    for swiglu in outside:  # LLaDA-MoE's shared expert, a sibling of the block
        _shard_swiglu(swiglu, rank, world)
        swiglu.register_forward_hook(_reduce_hook(group))


def _replace(root: nn.Module, path: str, module: nn.Module) -> None:
    *parents, leaf = path.split(".")
    node = root
    for name in parents:
        node = getattr(node, name)
    setattr(node, leaf, module)


def _refuse_save(*args, **kwargs):
    raise RuntimeError("this model is a tensor-parallel shard (a slice of every layer); save the unsharded model")


def shard_model(model: nn.Module, group=None) -> nn.Module:
    """Make ``model`` the tensor-parallel shard of this rank of ``group`` (default: the world), in place.

    Every rank must call it on the same weights. Returns the model, with ``model.tensor_parallel``
    (a :class:`TensorParallelInfo`). A world of one leaves the weights as they are.
    """
    if getattr(model, "tensor_parallel", None) is not None:
        raise ValueError("the model is already a tensor-parallel shard")
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("tensor parallelism needs an initialised torch.distributed process group "
                           "(torchrun, or dllm.parallel.tensor.init_from_env)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if world > 1:
        check_divisible(model, world)  # before any change: a refused model stays whole
        layers = list(model._blocks())
        for layer in layers:
            _shard_layer(layer, rank, world, group)
        spec = model.spec
        model.spec = dataclasses.replace(spec, num_heads=spec.num_heads // world,
                                         num_kv_heads=spec.num_kv_heads // world,
                                         intermediate_size=(spec.intermediate_size // world
                                                            if spec.intermediate_size % world == 0
                                                            else spec.intermediate_size))
        model.save_pretrained = _refuse_save
    model.tensor_parallel = TensorParallelInfo(rank, world, group)
    return model


def init_from_env(device: str | None = None) -> tuple[int, int, str | None]:
    """Start the default process group from torchrun's environment when ``WORLD_SIZE`` > 1.

    Returns ``(rank, world_size, device)``: ``device`` ``cuda`` becomes ``cuda:LOCAL_RANK`` (and
    NCCL the backend); anything else uses gloo. Without ``WORLD_SIZE`` > 1 nothing is started.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, device
    if device is not None and device.startswith("cuda"):
        if device == "cuda":
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(torch.device(device))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device is not None and device.startswith("cuda") else "gloo")
    return dist.get_rank(), dist.get_world_size(), device


def broadcast_int(value: int, src: int = 0) -> int:
    """``value`` of rank ``src`` on every rank (a sampling seed every rank must share)."""
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.broadcast(t, src=src)
    return int(t.item())
