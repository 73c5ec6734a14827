"""GPU hot paths of decoding on a LLaDA-8B-shaped model (random weights): one table.

    python benchmarks/gpu_bench.py --json gpu_bench.json          # CUDA (an H200: ~5 minutes)
    python benchmarks/gpu_bench.py --dry --json dry.json          # tiny shapes on CPU, well under a minute

Sections (each under its own timeout; a failing case or section is reported and the rest still run):

* ``confidence``: the fused confidence-statistics kernel vs the PyTorch path over V=126464 logits for
  N masked positions (``dllm.decoding.kernels.confidence.benchmark_confidence``), with the memory-bandwidth
  floor (the logits read once at the measured copy bandwidth).
* ``attention``: attention time per decoding step (mask construction once + one attention call
  per layer, 32 layers) for each cache shape -- no cache, prefix, dual (replace), the block-causal
  exact cache (D2F) and LoPA branches sharing a prefix -- with the ``sdpa`` and ``flex`` backends.
* ``e2e``: tokens/s of ``model.generate`` for threshold + dual cache (bidirectional), d2f and lopa
  (the block-causal view of the same weights) at batch 1 and 8, per attention backend.

Random weights make every step commit about one token (TPF ~ 1): tokens/s measures the cost of a
decoding step (forward + loop), not the parallelism a trained model reaches.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import platform
import signal
import sys
import time
from pathlib import Path

import torch

from dllm.eval.outputs import check_output_args

FULL = {  # LLaDA-8B: 32 layers, d 4096, 32 heads (MHA), SwiGLU 12288, vocab 126464
    "d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32, "mlp_hidden_size": 12288,
    "vocab": 126464, "mask_id": 126336, "eos_id": 126081, "dtype": "bf16", "device": "cuda",
    "conf_n": (32, 256), "conf_repeats": 20,
    "attn_prompt": 1024, "attn_gen": 256, "attn_block": 32, "attn_repeats": 10, "attn_batches": (1, 8),
    "e2e_prompt": 256, "e2e_new": 128, "e2e_block": 32, "e2e_batches": (1, 8), "lopa_branches": 3,
    "timeouts": {"confidence": 60, "attention": 150, "e2e": 300}, "budget": 480,
}
DRY = {  # tiny shapes on CPU (GQA on purpose: 4 query heads, 2 kv heads)
    "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "mlp_hidden_size": 128,
    "vocab": 512, "mask_id": 511, "eos_id": 510, "dtype": "fp32", "device": "cpu",
    "conf_n": (4, 16), "conf_repeats": 2,
    "attn_prompt": 40, "attn_gen": 24, "attn_block": 4, "attn_repeats": 2, "attn_batches": (1, 2),
    "e2e_prompt": 12, "e2e_new": 8, "e2e_block": 4, "e2e_batches": (1, 2), "lopa_branches": 2,
    "timeouts": {"confidence": 30, "attention": 30, "e2e": 60}, "budget": 110,
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SECTIONS = ("confidence", "attention", "e2e")


class SectionTimeout(BaseException):  # not an Exception: a per-case `except Exception` must not swallow it
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise SectionTimeout after ``seconds`` (SIGALRM; Python-level, between CUDA calls)."""
    if seconds <= 0:
        raise SectionTimeout("no time left in the budget")

    def fire(signum, frame):
        raise SectionTimeout(f"timed out after {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn, device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in ms (synchronised on CUDA)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


# --- model ---------------------------------------------------------------------------------------
def build_model(shape: dict, device: torch.device, dtype: torch.dtype):
    """A LLaDA-format model of the given shape: built on the meta device, materialised on ``device``."""
    from dllm.modeling import LLaDAConfig, LLaDAModelLM

    cfg = LLaDAConfig(
        d_model=shape["d_model"], n_layers=shape["n_layers"], n_heads=shape["n_heads"],
        n_kv_heads=shape["n_kv_heads"], mlp_hidden_size=shape["mlp_hidden_size"], vocab_size=shape["vocab"],
        embedding_size=shape["vocab"], mask_token_id=shape["mask_id"], eos_token_id=shape["eos_id"],
        pad_token_id=shape["eos_id"],
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # allocate bf16 directly: no 32 GB fp32 detour for 8B parameters
    try:
        with torch.device("meta"):
            model = LLaDAModelLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)  # RMSNorm scales
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.eval()


@contextlib.contextmanager
def block_causal_view(model, block_size: int):
    """The same weights viewed block-causally (how a D2F student runs), for the duration of the block."""
    spec = model.spec
    model.spec = dataclasses.replace(spec, attention_policy="block_causal", block_size=block_size)
    try:
        yield model
    finally:
        model.spec = spec


# --- sections ------------------------------------------------------------------------------------
def bench_confidence(shape, device, dtype, rows, deadline):
    try:
        from dllm.decoding.kernels.confidence import benchmark_confidence
    except ImportError as err:
        rows.append(row("confidence", "-", "kernel", note=f"skipped: {err}"))
        return
    for n in shape["conf_n"]:
        case = f"N={n} V={shape['vocab']} {shape['dtype']}"
        try:
            check_budget(deadline)
            r = benchmark_confidence(n, shape["vocab"], dtype, device, shape["conf_repeats"])
        except Exception as err:  # noqa: BLE001
            rows.append(row("confidence", case, "kernel", note=f"error: {err!r}"[:160]))
            continue
        floor = r.get("floor_ms")
        bw = r.get("bandwidth_gbs")
        note = f"floor {fmt(floor, 4)} ms @ {fmt(bw, 0)} GB/s" if floor is not None else ""
        if r.get("kernel_ms") is None:
            note += "; kernel not timed on this device (CPU without TRITON_INTERPRET)"
        rows.append(row("confidence", case, "pytorch", ms=r.get("torch_ms"), note=note, extra=r))
        rows.append(row("confidence", case, "kernel", ms=r.get("kernel_ms"), ref_ms=r.get("torch_ms"),
                        note=(f"fp32-accum {fmt(r.get('kernel_fp32_ms'), 4)} ms; x{fmt(r['kernel_ms'] / floor, 1)} "
                              f"the floor") if r.get("kernel_ms") and floor else ""))


def attention_cases(shape, batch):
    """(name, rows, policy, start, q_len, key_end, per-row prompt) of one decoding step per cache mode."""
    P, G, blk = shape["attn_prompt"], shape["attn_gen"], shape["attn_block"]
    T = P + G
    s = P + min(4, G // blk - 2) * blk  # a block in the middle of the generation
    k = shape.get("lopa_branches", 3)
    return [
        ("none (full canvas)", batch, "bidirectional", 0, T, T),
        ("prefix", batch, "bidirectional", s, T - s, T),
        ("dual (replace)", batch, "bidirectional", s, blk, T),
        ("d2f exact cache", batch, "block_causal", s, 2 * blk, s + 2 * blk),
        (f"lopa {k}+1 branches", batch * (k + 1), "block_causal", s, blk, s + blk),
    ]


def bench_attention(shape, device, dtype, backends, rows, deadline):
    from dllm.modeling.attention_backends import MaskSpec, attend

    H, Hkv = shape["n_heads"], shape["n_kv_heads"]
    hd = shape["d_model"] // H
    L = shape["n_layers"]
    P, T = shape["attn_prompt"], shape["attn_prompt"] + shape["attn_gen"]
    gen = torch.Generator(device=device).manual_seed(0)
    for batch in shape["attn_batches"]:
        for name, nrows, policy, start, q_len, key_end in attention_cases(shape, batch):
            case = f"{name} b={batch} q={q_len} kv={key_end}"
            valid = torch.ones(nrows, T, dtype=torch.bool, device=device)
            for r in range(nrows):  # left padding of a few slots on all but the first row
                valid[r, : (r % 4) * 8] = False
            q = torch.randn(nrows, H, q_len, hd, device=device, dtype=dtype, generator=gen)
            kv = torch.randn(nrows, Hkv, key_end, hd, device=device, dtype=dtype, generator=gen)
            ref = None
            outputs = {}
            new_spec = functools.partial(MaskSpec, policy=policy, block_size=shape["attn_block"], prompt_length=P,
                                         start=start, q_len=q_len, key_end=key_end, key_valid=valid, device=device)
            for be in backends:
                def step(be=be, new_spec=new_spec, q=q, kv=kv):
                    spec = new_spec()  # the mask is built once per forward, then shared by the L layers
                    out = None
                    for _ in range(L):
                        out = attend(q, kv, kv, spec, be, gqa=H != Hkv)
                    return out

                def build_mask(be=be, new_spec=new_spec, nrows=nrows):
                    spec = new_spec()
                    return spec.block_mask(nrows) if be == "flex" else spec.dense()

                try:
                    check_budget(deadline)
                    with torch.no_grad():
                        t0 = time.perf_counter()
                        outputs[be] = step()  # first call: compiles on CUDA
                        sync(device)
                        first = time.perf_counter() - t0
                        ms = time_ms(step, device, shape["attn_repeats"])
                except Exception as err:  # noqa: BLE001
                    rows.append(row("attention", case, be, note=f"error: {err!r}"[:160]))
                    continue
                with torch.no_grad():
                    mask_ms = time_ms(build_mask, device, shape["attn_repeats"])
                note = f"{L} layers; mask {mask_ms:.3f} ms of it; first call {first:.2f} s"
                if be != backends[0] and backends[0] in outputs:
                    diff = (outputs[be].float() - outputs[backends[0]].float()).abs().max().item()
                    note += f"; max|diff| vs {backends[0]} {diff:.1e}"
                rows.append(row("attention", case, be, ms=ms, ref_ms=ref, note=note))
                ref = ms if ref is None else ref


def e2e_configs(shape):
    from dllm.decoding.config import DiffusionGenerationConfig

    base = {"max_new_tokens": shape["e2e_new"], "block_length": shape["e2e_block"], "stop_at_eos": False,
            "return_dict_in_generate": True}
    return [
        ("threshold+dual", False, DiffusionGenerationConfig(strategy="threshold", cache="dual", threshold=0.9, **base)),
        ("d2f", True, DiffusionGenerationConfig(strategy="d2f", **base)),
        (f"lopa k={shape['lopa_branches']}", True,
         DiffusionGenerationConfig(strategy="lopa", lopa_branches=shape["lopa_branches"], **base)),
    ]


def bench_e2e(model, shape, device, backends, rows, deadline):
    vocab_low = min(shape["vocab"], 1000) - 4
    for batch in shape["e2e_batches"]:
        gen = torch.Generator().manual_seed(batch)
        ids = torch.randint(0, vocab_low, (batch, shape["e2e_prompt"]), generator=gen)
        mask = torch.ones_like(ids)
        for r in range(batch):  # left padding: prompts of different lengths
            mask[r, : (r % 4) * 2] = 0
            ids[r, : (r % 4) * 2] = shape["eos_id"]
        ids, mask = ids.to(device), mask.to(device)
        for label, block_causal, cfg in e2e_configs(shape):
            case = f"{label} b={batch}"
            ref = None
            ref_tokens = None
            for be in backends:
                try:
                    check_budget(deadline)
                    model.set_attention_backend(be)
                    view = block_causal_view(model, shape["e2e_block"]) if block_causal else contextlib.nullcontext()
                    with view:
                        t0 = time.perf_counter()
                        model.generate(ids, attention_mask=mask, generation_config=cfg)  # warm-up / compile
                        sync(device)
                        warm = time.perf_counter() - t0
                        t0 = time.perf_counter()
                        out = model.generate(ids, attention_mask=mask, generation_config=cfg)
                        sync(device)
                        wall = time.perf_counter() - t0
                except Exception as err:  # noqa: BLE001
                    rows.append(row("e2e", case, be, note=f"error: {err!r}"[:160]))
                    continue
                finally:
                    model.set_attention_backend(None)
                tokens = int(out.generated_tokens.sum())
                fwd = out.timings.get("forward_seconds") if isinstance(getattr(out, "timings", None), dict) else None
                same = None if ref_tokens is None else bool(torch.equal(out.sequences.cpu(), ref_tokens))
                note = f"TPF {float(out.tpf.float().mean()):.2f}; warm-up {warm:.1f} s"
                if fwd:
                    note += f"; forwards {100 * fwd / wall:.0f}% of wall"
                if same is not None:
                    note += f"; tokens {'==' if same else '!='} {backends[0]}"
                rows.append(row("e2e", case, be, ms=wall * 1e3, ref_ms=ref, tok_s=tokens / wall, note=note,
                                extra={"tokens": tokens, "same_tokens_as_first_backend": same,
                                       "forwards": out.num_forwards.tolist()}))
                if ref is None:
                    ref, ref_tokens = wall * 1e3, out.sequences.cpu()


# --- table ---------------------------------------------------------------------------------------
def row(section, case, variant, *, ms=None, ref_ms=None, tok_s=None, note="", extra=None):
    speedup = (ref_ms / ms) if (ms and ref_ms) else None
    return {"section": section, "case": case, "variant": variant, "ms": ms, "speedup": speedup,
            "tokens_per_s": tok_s, "note": note, "extra": extra or {}}


def fmt(x, digits=3):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}f}"


def render(rows) -> str:
    head = ["section", "case", "variant", "ms", "speedup", "tok/s", "note"]
    cells = [[r["section"], r["case"], r["variant"], fmt(r["ms"]),
              "-" if r["speedup"] is None else f"{r['speedup']:.2f}x", fmt(r["tokens_per_s"], 1), r["note"]]
             for r in rows]
    widths = [max(len(str(c[i])) for c in [head] + cells) for i in range(len(head) - 1)]
    lines = []
    for c in [head] + cells:
        lines.append("  ".join(str(v).ljust(w) for v, w in zip(c[:-1], widths)) + "  " + str(c[-1]))
        if c is head:
            lines.append("-" * min(160, sum(widths) + 2 * len(widths) + 4))
    return "\n".join(lines)


def check_budget(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise SectionTimeout("total time budget spent")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="tiny shapes on CPU (checks the script works)")
    ap.add_argument("--json", default=None, help="also write the rows and metadata here")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--backends", default="sdpa,flex", help="attention backends to compare (first = reference)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--budget", type=float, default=None, help="total seconds for all sections")
    args = ap.parse_args(argv)
    check_output_args(ap, args.json)

    shape = dict(DRY if args.dry else FULL)
    device = torch.device(args.device or shape["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: run with --dry for the CPU smoke test", file=sys.stderr)
        return 2
    dtype = DTYPES[shape["dtype"]]
    sections = [s for s in args.sections.split(",") if s]
    backends = [b for b in args.backends.split(",") if b]
    start = time.monotonic()
    deadline = start + (shape["budget"] if args.budget is None else args.budget)
    rows, status = [], {}
    meta = {"dry": args.dry, "device": str(device), "dtype": shape["dtype"], "torch": torch.__version__,
            "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
            "shape": {k: v for k, v in shape.items() if k != "timeouts"}, "backends": backends,
            "env": {k: os.environ[k] for k in ("DLLM_ATTN_BACKEND", "TRITON_INTERPRET") if k in os.environ}}

    model = None
    for name in sections:
        if name not in SECTIONS:
            status[name] = {"status": "error", "error": f"unknown section; valid: {', '.join(SECTIONS)}"}
            continue
        t0 = time.monotonic()
        limit = min(shape["timeouts"][name], deadline - t0)
        try:
            with time_limit(limit):
                if name == "confidence":
                    bench_confidence(shape, device, dtype, rows, deadline)
                elif name == "attention":
                    bench_attention(shape, device, dtype, backends, rows, deadline)
                else:
                    if model is None:
                        t_build = time.perf_counter()
                        model = build_model(shape, device, dtype)
                        meta["model_build_s"] = time.perf_counter() - t_build
                        meta["parameters"] = sum(p.numel() for p in model.parameters())
                    bench_e2e(model, shape, device, backends, rows, deadline)
            status[name] = {"status": "ok"}
        except SectionTimeout as err:
            status[name] = {"status": "timeout", "error": str(err)}
            rows.append(row(name, "-", "-", note=f"section stopped: {err}"))
        except Exception as err:  # noqa: BLE001 - report and go on with the next section
            status[name] = {"status": "error", "error": repr(err)[:300]}
            rows.append(row(name, "-", "-", note=f"section failed: {err!r}"[:200]))
        status[name]["seconds"] = round(time.monotonic() - t0, 2)

    meta["total_s"] = round(time.monotonic() - start, 2)
    print(f"# dllm GPU hot paths -- {meta['gpu'] or meta['device']}, {shape['dtype']}, torch {torch.__version__}"
          f"{' (DRY: tiny shapes on CPU)' if args.dry else ''}")
    print(render(rows))
    print("# sections: " + ", ".join(f"{k} {v['status']} ({v.get('seconds', 0)} s)" for k, v in status.items())
          + f"; total {meta['total_s']} s")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"meta": meta, "sections": status, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
