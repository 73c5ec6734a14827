"""Running one model over several processes (``torch.distributed``): :mod:`dllm.parallel.tensor`."""
