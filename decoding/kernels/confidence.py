"""Per-position confidence statistics over the vocabulary, fused into one pass on CUDA.

For N rows of logits ``[..., V]`` (the masked positions a decoding step may commit),
:func:`confidence_stats` returns per row

* ``token``       argmax (ties: lowest index, as ``torch.argmax``),
* ``max_prob``    softmax probability of ``token`` (= 1 / sum exp(l - max)),
* ``margin``      top-1 minus top-2 probability,
* ``entropy``     Shannon entropy of softmax(l) in nats,
* ``sample`` / ``sample_prob``  when ``noise`` (U(0,1), float64, shape ``[..., V]``) is given: the
  Gumbel-max sample argmax(l - T*log(-log u)) computed in float64, and its noise-free probability.

On CUDA (with triton) a Triton kernel streams each row once (online max / sum-exp, per-lane
accumulators merged at the end) and never materialises a softmax; elsewhere the pure-PyTorch
:func:`confidence_stats_reference` runs. ``precision="fp64"`` accumulates in float64 (what
LLaDA / Fast-dLLM use for confidences, so threshold decisions match the float64 reference);
``"fp32"`` is Dream's float32 softmax. The noise is drawn by the caller with ``torch.rand`` exactly
as :func:`dllm.decoding.sampling.gumbel_argmax` draws it, so the sample is the PyTorch path's sample.

Dispatch: :func:`use_triton_kernels` is True on CUDA when triton imports; ``DLLM_DISABLE_TRITON=1``
turns the kernels off, ``DLLM_FORCE_TRITON=1`` (or ``force=True``) turns them on for any device —
on CPU that needs Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is imported).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

STATS = ("max_prob", "margin", "entropy")
# Temperatures this small are greedy: dividing by them overflows to NaN probabilities.
GREEDY_BELOW = 1e-5
_BLOCK = 1024


class ConfidenceStats(NamedTuple):
    token: torch.Tensor                       # int64 [...]
    max_prob: torch.Tensor | None = None      # float64 (precision fp64) or float32 [...]
    margin: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    sample: torch.Tensor | None = None        # int64 [...], only with noise
    sample_prob: torch.Tensor | None = None


# ---------------------------------------------------------------------------------------------
# dispatch


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton
        import triton.language  # noqa: F401
    except Exception:  # noqa: BLE001 -- ImportError, or a broken install that fails on import
        return False
    return True


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def interpreter_mode() -> bool:
    return _env_flag("TRITON_INTERPRET")


def use_triton_kernels(device: torch.device | str | None, force: bool | None = None) -> bool:
    """Whether the Triton kernels should run for tensors on ``device``.

    ``force`` (True/False) overrides everything; otherwise ``DLLM_DISABLE_TRITON=1`` disables,
    ``DLLM_FORCE_TRITON=1`` enables on any device, and the default is: CUDA and triton importable.
    Forcing on a non-CUDA device requires ``TRITON_INTERPRET=1`` (checked at launch).
    """
    if force is not None:
        return bool(force) and triton_available()
    if _env_flag("DLLM_DISABLE_TRITON"):
        return False
    if _env_flag("DLLM_FORCE_TRITON"):
        return triton_available()
    dev = torch.device(device) if device is not None else torch.device("cpu")
    return dev.type == "cuda" and triton_available()


# ---------------------------------------------------------------------------------------------
# shared argument handling


def _check(logits: torch.Tensor, temperature: float, noise: torch.Tensor | None, need: Sequence[str],
           rows: torch.Tensor | None, precision: str) -> tuple[tuple[int, ...], set[str]]:
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must be [..., V] with V >= 1, got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    if precision not in ("fp32", "fp64"):
        raise ValueError(f"precision={precision!r}; valid: fp32, fp64")
    need = set(need)
    bad = need - set(STATS)
    if bad:
        raise ValueError(f"need={sorted(bad)}; valid: {', '.join(STATS)}")
    out_shape = tuple(logits.shape[:-1]) if rows is None else (int(rows.numel()),)
    if noise is not None:
        want = (*out_shape, logits.shape[-1])
        if tuple(noise.shape) != want or noise.dtype != torch.float64:
            raise ValueError(f"noise must be float64 of shape {want}, got {noise.dtype} {tuple(noise.shape)}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
    return out_shape, need


# ---------------------------------------------------------------------------------------------
# reference (CPU path)


def confidence_stats_reference(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    noise: torch.Tensor | None = None,
    need: Sequence[str] = STATS,
    rows: torch.Tensor | None = None,
    precision: str = "fp64",
    nan_on_neg_inf: bool = False,
) -> ConfidenceStats:
    """Pure-PyTorch statistics (materialises the softmax): the definition the kernel is tested against."""
    out_shape, need = _check(logits, temperature, noise, need, rows, precision)
    V = logits.shape[-1]
    x = logits.reshape(-1, V)
    if rows is not None:
        x = x[rows.to(x.device).long()]
    acc = torch.float64 if precision == "fp64" else torch.float32
    logp = F.log_softmax(x.to(acc), dim=-1)
    p = logp.exp()
    token = x.argmax(-1)
    max_prob = p.gather(-1, token[:, None]).squeeze(-1)
    margin = ent = sample = sample_prob = None
    if "margin" in need:
        if V >= 2:
            top2 = torch.topk(p, 2, dim=-1).values
            margin = top2[:, 0] - top2[:, 1]
        else:
            margin = max_prob.clone()
    if "entropy" in need:
        # 0 log 0 = 0 for -inf logits, unless asked for torch's plain -(p * logp).sum (NaN there)
        ent = -(p * logp).sum(-1) if nan_on_neg_inf else -torch.where(p > 0, p * logp, 0.0).sum(-1)
    if noise is not None:
        u = noise.reshape(-1, V)
        sample = (x.double() - temperature * torch.log(-torch.log(u))).argmax(-1)
        sample_prob = p.gather(-1, sample[:, None]).squeeze(-1)

    def shape(t):
        return None if t is None else t.reshape(out_shape)

    return ConfidenceStats(shape(token), shape(max_prob) if "max_prob" in need else None, shape(margin),
                           shape(ent), shape(sample), shape(sample_prob))


# ---------------------------------------------------------------------------------------------
# kernel


def confidence_stats_triton(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    noise: torch.Tensor | None = None,
    need: Sequence[str] = STATS,
    rows: torch.Tensor | None = None,
    precision: str = "fp64",
    nan_on_neg_inf: bool = False,
) -> ConfidenceStats:
    """The fused kernel (CUDA, or CPU under ``TRITON_INTERPRET=1``). Same contract as the reference."""
    out_shape, need = _check(logits, temperature, noise, need, rows, precision)
    dev = logits.device
    if dev.type != "cuda" and not interpreter_mode():
        raise RuntimeError("the Triton kernel on a non-CUDA tensor needs TRITON_INTERPRET=1 set before triton "
                           "is imported; use confidence_stats_reference (or confidence_stats) instead")
    from ._confidence_triton import _confidence_kernel

    V = logits.shape[-1]
    x = logits
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 1:
        x = x[None]
    if x.dim() > 3:
        x = x.reshape(-1, *x.shape[-2:])  # a copy only if the leading dims cannot be merged
    if x.dim() == 2:
        x = x[None]
    L = x.shape[1]
    n_rows = x.shape[0] * L
    if rows is not None:
        rows_t = rows.to(device=dev, dtype=torch.int64).reshape(-1)
        if rows_t.numel() and (int(rows_t.min()) < 0 or int(rows_t.max()) >= n_rows):
            raise IndexError(f"rows out of range for {n_rows} rows")
    N = 1
    for d in out_shape:
        N *= d
    acc = torch.float64 if precision == "fp64" else torch.float32
    token = torch.empty(N, dtype=torch.int64, device=dev)
    pmax = torch.empty(N, dtype=acc, device=dev)
    margin = torch.empty(N, dtype=acc, device=dev) if "margin" in need else pmax
    ent = torch.empty(N, dtype=acc, device=dev) if "entropy" in need else pmax
    if noise is not None:
        u = noise.contiguous()
        sample = torch.empty(N, dtype=torch.int64, device=dev)
        sprob = torch.empty(N, dtype=acc, device=dev)
        temp = torch.tensor([float(temperature)], dtype=torch.float64, device=dev)
    else:
        u, sample, sprob, temp = pmax, token, pmax, pmax
    if N:
        block = min(_BLOCK, max(16, triton_next_pow2(V)))
        _confidence_kernel[(N,)](
            x, x.stride(0), x.stride(1), L,
            rows_t if rows is not None else token,
            u, temp, V,
            token, pmax, margin, ent, sample, sprob,
            BLOCK=block, HAS_ROWS=rows is not None, HAS_NOISE=noise is not None,
            NEED_MARGIN="margin" in need, NEED_ENT="entropy" in need, FP64=precision == "fp64",
            NAN_ON_NEG_INF=bool(nan_on_neg_inf),
            num_warps=4 if block <= 1024 else 8,
            # no FMA contraction: l - T*log(-log u) is rounded exactly as PyTorch's separate mul and sub
            enable_fp_fusion=False,
        )

    def shape(t):
        return t.reshape(out_shape)

    return ConfidenceStats(
        shape(token),
        shape(pmax) if "max_prob" in need else None,
        shape(margin) if "margin" in need else None,
        shape(ent) if "entropy" in need else None,
        shape(sample) if noise is not None else None,
        shape(sprob) if noise is not None else None,
    )


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def confidence_stats(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    noise: torch.Tensor | None = None,
    need: Sequence[str] = STATS,
    rows: torch.Tensor | None = None,
    precision: str = "fp64",
    nan_on_neg_inf: bool = False,
    force_kernel: bool | None = None,
) -> ConfidenceStats:
    """Statistics of ``logits`` [..., V] (or of the flat ``rows`` of it): the kernel where
    :func:`use_triton_kernels` says so, the PyTorch reference otherwise.

    ``need`` names the optional statistics among ``max_prob``, ``margin``, ``entropy`` (the token
    always comes back; unrequested fields are None). ``noise`` switches on the Gumbel-max sample.
    The entropy treats 0 * log 0 as 0 (a -inf logit adds nothing); ``nan_on_neg_inf=True`` instead
    reproduces the plain PyTorch formula -(p * log p).sum, which is NaN for such rows (what
    :func:`dllm.decoding.sampling.entropy` computes).
    """
    fn = confidence_stats_triton if use_triton_kernels(logits.device, force_kernel) else confidence_stats_reference
    return fn(logits, temperature=temperature, noise=noise, need=need, rows=rows, precision=precision,
              nan_on_neg_inf=nan_on_neg_inf)


# ---------------------------------------------------------------------------------------------
# benchmark


def _timer(device: torch.device):
    if device.type == "cuda":
        def run(fn, repeats):
            fn()
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                fn()
            end.record()
            torch.cuda.synchronize(device)
            return start.elapsed_time(end) / repeats
    else:
        def run(fn, repeats):
            fn()
            t = time.perf_counter()
            for _ in range(repeats):
                fn()
            return (time.perf_counter() - t) * 1e3 / repeats
    return run


def measure_bandwidth(device: torch.device | str, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written per copy)."""
    device = torch.device(device)
    n = max(1, nbytes // 4)
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    ms = _timer(device)(lambda: dst.copy_(src), repeats)
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def benchmark_confidence(n: int, v: int, dtype: torch.dtype | str = torch.bfloat16, device: torch.device | str = "cuda",
                         repeats: int = 20, *, temperature: float = 0.0, bandwidth_bytes: int | None = None) -> dict:
    """Time the confidence statistics of ``n`` rows x ``v`` logits: kernel vs the PyTorch path.

    The PyTorch path is what :mod:`dllm.decoding.sampling` runs without the kernel: LLaDA's float64
    softmax + gather of the argmax (or Gumbel sample) probability, plus Dream's fp32 margin and
    the entropy. The floor is the time to read the logits once at the measured copy bandwidth.
    On CPU (a "dry" run) the kernel is timed only under the Triton interpreter; otherwise
    ``kernel_ms`` is None.
    """
    device = torch.device(device)
    if isinstance(dtype, str):
        dtype = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
                 "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}[dtype]
    gen = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(n, v, generator=gen, device=device) * 4).to(dtype)
    sample = temperature >= GREEDY_BELOW
    noise = torch.rand(n, v, dtype=torch.float64, device=device, generator=gen) if sample else None

    def torch_path():
        if sample:
            x0 = (logits.double() - temperature * torch.log(-torch.log(noise))).argmax(-1)
        else:
            x0 = logits.argmax(-1)
        p64 = torch.softmax(logits.double(), -1).gather(-1, x0[:, None])
        p32 = torch.softmax(logits.float(), -1)
        top2 = torch.topk(p32, 2, -1).values
        ent = -(p32 * torch.log(p32 + 1e-10)).sum(-1)
        return p64, top2, ent

    def kernel_path():
        return confidence_stats_triton(logits, temperature=temperature, noise=noise, precision="fp64")

    def kernel_path_fp32():
        return confidence_stats_triton(logits, temperature=temperature, noise=noise, precision="fp32")

    timer = _timer(device)
    run_kernel = use_triton_kernels(device) and (device.type == "cuda" or interpreter_mode())
    cpu_dry = device.type != "cuda"
    reps = 1 if (cpu_dry and interpreter_mode()) else repeats
    kernel_ms = timer(kernel_path, reps) if run_kernel else None
    kernel_fp32_ms = timer(kernel_path_fp32, reps) if run_kernel else None
    torch_ms = timer(torch_path, repeats)
    if bandwidth_bytes is None:
        bandwidth_bytes = (1 << 30) if device.type == "cuda" else (1 << 24)
    bw = measure_bandwidth(device, bandwidth_bytes, repeats=max(2, min(repeats, 10)))
    logit_bytes = n * v * logits.element_size()
    noise_bytes = noise.numel() * 8 if noise is not None else 0
    return {
        "n": n, "v": v, "dtype": str(dtype).replace("torch.", ""), "device": str(device),
        "temperature": temperature,
        "kernel_ms": kernel_ms, "kernel_fp32_ms": kernel_fp32_ms, "torch_ms": torch_ms,
        "bandwidth_gbs": bw, "logit_bytes": logit_bytes, "noise_bytes": noise_bytes,
        "floor_ms": logit_bytes / (bw * 1e9) * 1e3,
        "floor_with_noise_ms": (logit_bytes + noise_bytes) / (bw * 1e9) * 1e3,
        "speedup": (torch_ms / kernel_ms) if kernel_ms else None,
        "interpreted": bool(run_kernel and device.type != "cuda"),
    }
