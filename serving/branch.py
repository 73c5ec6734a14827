"""``--branch-parallel N``: hand LoPA branch evaluation to N worker processes.

The executor itself belongs to ``decoding`` (it runs LoPA rounds over torch.distributed). The
server only needs this contract from ``dllm.decoding.branch_parallel``::

    executor = BranchParallelExecutor(model_path, world_size=N, dtype=..., device=...)
    executor.generate(input_ids, attention_mask=..., generation_config=..., streamer=..., tokenizer=...)
    executor.close()

``generate`` has ``model.generate``'s signature and result (rank 0 runs the control loop, the
other ranks evaluate branches); ``executor.model`` is the rank-0 model the server also uses for
its checks. Requests with another strategy than ``lopa`` run on rank 0 alone. Where the module is
missing, ``N > 1`` fails at startup with a clear message instead of silently serving
single-process.
"""

from __future__ import annotations

import importlib

MODULE = "dllm.decoding.branch_parallel"
CLASS = "BranchParallelExecutor"


class BranchParallelUnavailable(RuntimeError):
    pass


def executor_class():
    """The executor class, or raise :class:`BranchParallelUnavailable` saying what is missing."""
    try:
        module = importlib.import_module(MODULE)
    except ImportError as err:
        if getattr(err, "name", None) not in (MODULE, "decoding"):
            raise BranchParallelUnavailable(f"{MODULE} failed to import: {err}") from err
        raise BranchParallelUnavailable(
            f"--branch-parallel N > 1 needs the branch-parallel LoPA executor ({MODULE}.{CLASS}), which this "
            "installation of dllm does not have yet; serve with --branch-parallel 1 (LoPA still runs in one "
            "process with strategy='lopa' if the decoding engine offers it)"
        ) from None
    cls = getattr(module, CLASS, None)
    if cls is None:
        raise BranchParallelUnavailable(f"{MODULE} has no {CLASS}; this server expects the contract described in "
                                        "serving/branch.py")
    return cls


def start_executor(model_path, world_size: int, **kwargs):
    """Spawn the ranks; the returned executor holds the rank-0 model as ``executor.model``."""
    return executor_class()(model_path, world_size=world_size, **kwargs)
