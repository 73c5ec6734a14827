"""The Triton kernel behind :func:`dllm.decoding.kernels.confidence.confidence_stats`.

Imported lazily (only when the kernel runs), so importing ``dllm`` never imports ``triton`` and
``TRITON_INTERPRET=1`` can still be set by a process before its first kernel launch.

One program per row streams the row's V logits once, in chunks of ``BLOCK``. Every lane of the
chunk keeps its own running state (elementwise updates, one ``exp`` per element; no cross-lane
reduction inside the loop):

* ``m``  running max, ``i1`` its index (first occurrence), ``v2`` the runner-up value;
* ``s``  sum of exp(x - m), ``w`` sum of exp(x - m) * (x - m) (for the entropy);
* ``gb``, ``gi``, ``gl`` the best Gumbel score l - T*log(-log u) (fp64), its index and its logit.

The lanes are merged once at the end: M = max m, S = sum s*exp(m - M), entropy = log S - W/S,
p(top1) = 1/S, margin = (1 - exp(v2 - M))/S, p(sample) = exp(l_sample - M)/S.
Ties resolve to the lowest index, as ``torch.argmax`` does.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _confidence_kernel(
    x_ptr, stride_b, stride_l, L,          # logits viewed as [B, L, V], last stride 1
    rows_ptr,                              # optional int64 [N] flat row indices (HAS_ROWS)
    u_ptr,                                 # optional float64 noise [N, V] contiguous (HAS_NOISE)
    temp_ptr,                              # float64 [1]: the Gumbel scale (a tensor: scalar args are fp32)
    V,
    tok_ptr, pmax_ptr, margin_ptr, ent_ptr, stok_ptr, sprob_ptr,
    BLOCK: tl.constexpr,
    HAS_ROWS: tl.constexpr,
    HAS_NOISE: tl.constexpr,
    NEED_MARGIN: tl.constexpr,
    NEED_ENT: tl.constexpr,
    FP64: tl.constexpr,
    NAN_ON_NEG_INF: tl.constexpr,          # entropy NaN for rows with a -inf logit (torch's 0 * -inf)
):
    pid = tl.program_id(0)
    if HAS_ROWS:
        r = tl.load(rows_ptr + pid).to(tl.int64)
    else:
        r = pid.to(tl.int64)
    b = r // L
    row_off = b * stride_b + (r - b * L) * stride_l
    acc_t = tl.float64 if FP64 else tl.float32
    if HAS_NOISE:
        temperature = tl.load(temp_ptr)
    neg_inf = float("-inf")

    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], neg_inf, acc_t)
    s = tl.zeros([BLOCK], acc_t)
    w = tl.zeros([BLOCK], acc_t)
    v2 = tl.full([BLOCK], neg_inf, acc_t)
    i1 = tl.zeros([BLOCK], tl.int32)
    gb = tl.full([BLOCK], neg_inf, tl.float64)
    gi = tl.zeros([BLOCK], tl.int32)
    gl = tl.full([BLOCK], neg_inf, acc_t)
    ninf = tl.zeros([BLOCK], tl.int32)

    for start in range(0, V, BLOCK):
        idx = start + lanes
        inb = idx < V
        xr = tl.load(x_ptr + row_off + idx, mask=inb, other=neg_inf)
        x = xr.to(acc_t)
        valid = x > neg_inf
        gt = x > m                                   # strict: the first occurrence keeps the lead
        # <= 0; masked / -inf entries give -inf (never -inf - -inf), so they contribute nothing
        diff = tl.where(gt, m - tl.where(valid, x, 0.0), x - tl.where(valid, m, 0.0))
        e = tl.exp(diff)
        if NEED_ENT:
            if NAN_ON_NEG_INF:
                ninf = tl.maximum(ninf, (inb & (xr == neg_inf)).to(tl.int32))
            dd = tl.where(e > 0, diff, 0.0)          # avoid 0 * inf when exp underflows
            w = tl.where(gt, e * (w + dd * s), w + e * dd)
        s = tl.where(gt, s * e + 1.0, s + e)
        if NEED_MARGIN:
            v2 = tl.where(gt, m, tl.maximum(v2, x))
        i1 = tl.where(gt, idx, i1)
        m = tl.where(gt, x, m)
        if HAS_NOISE:
            u = tl.load(u_ptr + pid.to(tl.int64) * V + idx, mask=inb, other=0.5)
            g = xr.to(tl.float64) - temperature * tl.log(-tl.log(u))
            better = g > gb
            gb = tl.where(better, g, gb)
            gi = tl.where(better, idx, gi)
            gl = tl.where(better, x, gl)

    big = 2147483647
    M = tl.max(m, 0)
    c = tl.where(m > neg_inf, tl.exp(m - M), 0.0)
    S = tl.sum(s * c, 0)
    top = tl.min(tl.where(m == M, i1, big), 0)
    tl.store(tok_ptr + pid, top.to(tl.int64))
    inv = 1.0 / S
    tl.store(pmax_ptr + pid, inv)
    if NEED_MARGIN:
        others = tl.where(i1 == top, neg_inf, m)
        V2 = tl.maximum(tl.max(v2, 0), tl.max(others, 0))
        tl.store(margin_ptr + pid, inv - tl.exp(V2 - M) * inv)
    if NEED_ENT:
        sh = tl.where(c > 0, m - M, 0.0)
        W = tl.sum(c * (w + sh * s), 0)
        H = tl.log(S) - W * inv
        if NAN_ON_NEG_INF:
            H = tl.where(tl.max(ninf, 0) > 0, float("nan"), H)
        tl.store(ent_ptr + pid, H)
    if HAS_NOISE:
        G = tl.max(gb, 0)
        si = tl.min(tl.where(gb == G, gi, big), 0)
        lx = tl.max(tl.where(gi == si, gl, neg_inf), 0)
        tl.store(stok_ptr + pid, si.to(tl.int64))
        tl.store(sprob_ptr + pid, tl.exp(lx - M) * inv)
