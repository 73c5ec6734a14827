"""Running one model over several processes (``torch.distributed``): :mod:`dllm.parallel.tensor`, and
:mod:`dllm.parallel.mesh` (LoPA branch ranks x tensor ranks)."""
