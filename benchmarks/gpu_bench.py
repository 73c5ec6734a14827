"""GPU hot paths of decoding on 8B-shaped models (random weights): one table.

    python benchmarks/gpu_bench.py --json gpu_bench.json          # CUDA: at most 330 s (--budget)
    python benchmarks/gpu_bench.py --dry --json dry.json          # tiny shapes on CPU, well under a minute

Sections, in the order they run (each under its own timeout and the total ``--budget``; a failing case or
section is reported and the rest still run):

* ``confidence``: the fused confidence-statistics kernel vs the PyTorch path over V=126464 logits for
  N masked positions (``dllm.decoding.kernels.confidence.benchmark_confidence``), with the memory-bandwidth
  floor (the logits read once at the measured copy bandwidth).
* ``e2e``: ``model.generate`` on LLaDA-8B, SDAR-8B (Qwen3-8B) and Dream-7B shapes at batch 1, 8 and 32
  (every family at batch 1 first): vanilla, ``threshold`` without a cache and with the prefix and dual
  caches, ``d2f`` and LoPA on the block-causal view of the LLaDA weights, ``sdar`` and Dream's
  ``threshold`` + dual cache. Random weights are never confident, so every forward is made to commit
  ``--tpf`` tokens per row (:func:`forced_commits`); each row gives tokens/s, TPF, ms per forward (the
  cache mode's forward: full canvas, prefix, dual, exact block cache) and the share of the wall time
  spent inside model forwards. The first cases are repeated with the ``flex`` attention backend.
* ``attention``: attention time per decoding step (mask construction once + one attention call
  per layer, 32 layers) for each cache shape -- no cache, prefix, dual (replace), the block-causal
  exact cache (D2F) and LoPA branches sharing a prefix -- with the ``sdpa`` and ``flex`` backends.
* ``compile``: ``threshold`` + dual cache and ``d2f`` at batch 1 with the model's forward under
  ``torch.compile`` (``compile``) and with CUDA graphs (``compile+cudagraphs``: mode "reduce-overhead"),
  against eager; ``--dry`` compiles with the "eager" backend (the graph capture alone, no C++ build).
* ``tests``: ``pytest -m gpu`` (``--test-paths``), its summary line.
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
from dllm.testing import HostReads, forced_commits

FULL = {  # LLaDA-8B: 32 layers, d 4096, 32 heads (MHA), SwiGLU 12288, vocab 126464
    "d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32, "mlp_hidden_size": 12288,
    "vocab": 126464, "mask_id": 126336, "eos_id": 126081, "dtype": "bf16", "device": "cuda",
    "conf_n": (32, 256), "conf_repeats": 20,
    "attn_prompt": 1024, "attn_gen": 256, "attn_block": 32, "attn_repeats": 10, "attn_batches": (1, 8),
    "e2e_prompt": 256, "e2e_new": 128, "e2e_block": 32, "e2e_batches": (1, 8, 32), "lopa_branches": 3,
    "e2e_families": ("llada-8b", "sdar-8b", "dream-7b"),
    "timeouts": {"confidence": 45, "e2e": 200, "attention": 90, "compile": 90, "tests": 90}, "budget": 330,
}
DRY = {  # tiny shapes on CPU (GQA on purpose: 4 query heads, 2 kv heads)
    "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "mlp_hidden_size": 128,
    "vocab": 512, "mask_id": 511, "eos_id": 510, "dtype": "fp32", "device": "cpu",
    "conf_n": (4, 16), "conf_repeats": 2,
    "attn_prompt": 40, "attn_gen": 24, "attn_block": 4, "attn_repeats": 2, "attn_batches": (1, 2),
    "e2e_prompt": 12, "e2e_new": 32, "e2e_block": 4, "e2e_batches": (1, 2), "lopa_branches": 2,
    "e2e_families": ("llada-dry", "sdar-dry", "dream-dry"),
    "timeouts": {"confidence": 30, "e2e": 60, "attention": 30, "compile": 60, "tests": 60}, "budget": 150,
}
# The published shapes (config.json of each checkpoint); "-dry": the same formats at toy size.
FAMILY_SHAPES = {
    "llada-8b": {"format": "llada"},  # the LLaDA shape above
    "sdar-8b": {"format": "sdar", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                "mask_token_id": 151669, "eos_token_id": 151643, "block_size": 4},  # SDAR-8B-Chat (Qwen3-8B)
    "dream-7b": {"format": "dream", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                 "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                 "mask_token_id": 151666, "eos_token_id": 151643},  # Dream-v0-7B (Qwen2.5-7B)
    "llada-dry": {"format": "llada"},
    "sdar-dry": {"format": "sdar", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
                 "mask_token_id": 511, "eos_token_id": 510, "block_size": 4},
    "dream-dry": {"format": "dream", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "mask_token_id": 511,
                  "eos_token_id": 510},
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SECTIONS = ("confidence", "e2e", "attention", "compile", "tests")


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
def family_config(shape: dict, family: str):
    """(config, model class) of ``family`` (a key of FAMILY_SHAPES); "llada" takes the LLaDA shape of ``shape``."""
    fam = dict(FAMILY_SHAPES[family])
    fmt = fam.pop("format")
    if fmt == "llada":
        from dllm.modeling import LLaDAConfig, LLaDAModelLM

        return LLaDAConfig(
            d_model=shape["d_model"], n_layers=shape["n_layers"], n_heads=shape["n_heads"],
            n_kv_heads=shape["n_kv_heads"], mlp_hidden_size=shape["mlp_hidden_size"], vocab_size=shape["vocab"],
            embedding_size=shape["vocab"], mask_token_id=shape["mask_id"], eos_token_id=shape["eos_id"],
            pad_token_id=shape["eos_id"],
        ), LLaDAModelLM
    ids = {"pad_token_id": fam["eos_token_id"], "bos_token_id": fam["eos_token_id"]}
    if fmt == "sdar":
        from dllm.modeling import SDARForCausalLM
        from dllm.testing import tiny_block_config  # the published SDAR config keys, here at real size

        return tiny_block_config("sdar", **fam, **ids), SDARForCausalLM
    from dllm.modeling import DreamConfig, DreamModel

    return DreamConfig(rope_theta=1e6, **fam, **ids), DreamModel


def build_model(shape: dict, device: torch.device, dtype: torch.dtype, family: str | None = None):
    """A model of ``family`` (default: the LLaDA shape of ``shape``) with random weights: built on the meta
    device, materialised on ``device``."""
    cfg, cls = family_config(shape, family or next(k for k, v in FAMILY_SHAPES.items() if v["format"] == "llada"))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # allocate bf16 directly: no 32 GB fp32 detour for 8B parameters
    try:
        with torch.device("meta"):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(previous)
    model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
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


@dataclasses.dataclass(frozen=True)
class E2ECase:
    family: str
    label: str
    cfg: object  # DiffusionGenerationConfig
    block_causal_view: bool = False  # the LLaDA weights viewed block-causally (a D2F student)


def e2e_cases(shape: dict, tpf: int) -> list[E2ECase]:
    """The strategies of each family, each with its own cache mode."""
    from dllm.decoding.config import DiffusionGenerationConfig as C

    new, blk = shape["e2e_new"], shape["e2e_block"]
    base = {"max_new_tokens": new, "block_length": blk, "stop_at_eos": False, "return_dict_in_generate": True}
    llada, sdar, dream = shape["e2e_families"]
    sdar_block = FAMILY_SHAPES[sdar]["block_size"]
    return [
        E2ECase(llada, "threshold+dual", C(strategy="threshold", cache="dual", threshold=0.9, **base)),
        E2ECase(llada, "d2f", C(strategy="d2f", **base), True),
        E2ECase(llada, "vanilla", C(strategy="vanilla", steps=max(1, new // tpf), **base)),
        E2ECase(llada, "threshold", C(strategy="threshold", threshold=0.9, **base)),
        E2ECase(llada, "threshold+prefix", C(strategy="threshold", cache="prefix", threshold=0.9, **base)),
        E2ECase(llada, f"lopa k={shape['lopa_branches']}",
                C(strategy="lopa", lopa_branches=shape["lopa_branches"], **base), True),
        E2ECase(sdar, "sdar", C(strategy="sdar", threshold=0.9, **{**base, "block_length": sdar_block})),
        E2ECase(dream, "threshold+dual", C(strategy="threshold", cache="dual", threshold=0.9, **base)),
    ]


def _e2e_inputs(shape: dict, batch: int, vocab: int, eos_id: int, device: torch.device):
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, min(vocab, 1000) - 4, (batch, shape["e2e_prompt"]), generator=gen)
    mask = torch.ones_like(ids)
    for r in range(batch):  # left padding: prompts of different lengths
        mask[r, : (r % 4) * 2] = 0
        ids[r, : (r % 4) * 2] = eos_id
    return ids.to(device), mask.to(device)


def run_generate(model, case: E2ECase, ids, mask, device, shape, tpf: int, *, warmups: int = 1,
                 host_reads: bool = False) -> dict:
    """One timed ``generate`` after ``warmups`` untimed ones: tokens/s, TPF, ms per forward, forwards' share;
    with ``host_reads``, one more untimed run counts the host synchronisations per forward (HostReads)."""
    view = block_causal_view(model, shape["e2e_block"]) if case.block_causal_view else contextlib.nullcontext()
    with view, forced_commits(model, tpf, model.config.mask_token_id, token=7):
        t0 = time.perf_counter()
        for _ in range(warmups):
            model.generate(ids, attention_mask=mask, generation_config=case.cfg)
        sync(device)
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, generation_config=case.cfg)
        sync(device)
        wall = time.perf_counter() - t0
        reads = None
        if host_reads:
            counter = HostReads()
            with counter:
                model.generate(ids, attention_mask=mask, generation_config=case.cfg)
            reads = counter.total / max(1, int(out.num_forwards.max()))
    tokens = int(out.generated_tokens.sum())
    forwards = int(out.num_forwards.max())
    fwd_s = float(out.timings.get("forward_seconds", 0.0))
    return {"wall": wall, "warm": warm, "tokens": tokens, "tpf": float(out.tpf.float().mean()),
            "forwards": out.num_forwards.tolist(), "forward_seconds": fwd_s, "host_reads_per_forward": reads,
            "ms_per_forward": 1e3 * fwd_s / max(1, forwards), "forward_share": fwd_s / wall,
            "sequences": out.sequences.cpu()}


def generate_row(section, case, variant, r: dict, first: dict | None, first_name: str, same_key: str, **extra):
    """A table row of a ``run_generate`` result, against the case's first variant (speed and tokens)."""
    same = None if first is None else bool(torch.equal(r["sequences"], first["sequences"]))
    note = (f"TPF {r['tpf']:.2f}; {r['ms_per_forward']:.2f} ms/forward; forwards "
            f"{100 * r['forward_share']:.0f}% of wall; warm-up {r['warm']:.1f} s")
    if r["host_reads_per_forward"] is not None:
        note += f"; {r['host_reads_per_forward']:.1f} host reads/forward"
    if same is not None:
        note += f"; tokens {'==' if same else '!='} {first_name}"
    return row(section, case, variant, ms=r["wall"] * 1e3, ref_ms=first and first["wall"] * 1e3,
               tok_s=r["tokens"] / r["wall"], note=note,
               extra={k: v for k, v in r.items() if k != "sequences"} | {same_key: same, **extra})


def bench_e2e(shape, device, dtype, backends, tpf, rows, deadline, meta, host_reads=False):
    """Every family's cases at batch 1, then at each larger batch (the models stay loaded: 47 GB in bf16 at
    full size); the first backend for all, the others for the first two cases at batch 1 (compared token
    for token)."""
    cases = e2e_cases(shape, tpf)
    models: dict = {}
    try:
        for batch in shape["e2e_batches"]:
            for i, case in enumerate(cases):
                name = f"{case.family} {case.label} b={batch}"
                first = None
                for be in backends if (batch == shape["e2e_batches"][0] and i < 2) else backends[:1]:
                    try:
                        check_budget(deadline)
                        if case.family not in models:
                            t_build = time.perf_counter()
                            models[case.family] = build_model(shape, device, dtype, case.family)
                            meta.setdefault("models", {})[case.family] = {
                                "parameters": sum(p.numel() for p in models[case.family].parameters()),
                                "build_s": round(time.perf_counter() - t_build, 2)}
                        model = models[case.family]
                        ids, mask = _e2e_inputs(shape, batch, model.config.vocab_size, model.config.eos_token_id,
                                                device)
                        model.set_attention_backend(be)
                        r = run_generate(model, case, ids, mask, device, shape, tpf,
                                         host_reads=host_reads and be == backends[0])
                    except Exception as err:  # noqa: BLE001
                        rows.append(row("e2e", name, be, note=f"error: {err!r}"[:160]))
                        continue
                    finally:
                        for m in models.values():
                            m.set_attention_backend(None)
                    rows.append(generate_row("e2e", name, be, r, first, backends[0], "same_tokens_as_first_backend"))
                    first = first or r
    finally:
        models.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def bench_compile(shape, device, dtype, tpf, rows, deadline, compile_backend):
    """``threshold`` + dual and ``d2f`` at batch 1: eager, the forward under torch.compile, and with CUDA graphs."""
    cases = e2e_cases(shape, tpf)[:2]
    model = build_model(shape, device, dtype, cases[0].family)
    ids, mask = _e2e_inputs(shape, 1, model.config.vocab_size, model.config.eos_token_id, device)
    variants = [("eager", None), ("compile", "default")]
    if device.type == "cuda":
        variants.append(("compile+cudagraphs", "reduce-overhead"))
    eager_forward = model.forward
    try:
        for case in cases:
            first = None
            for name, mode in variants:
                label = f"{cases[0].family} {case.label} b=1"
                try:
                    check_budget(deadline)
                    torch._dynamo.reset()
                    if mode is not None:
                        model.forward = torch.compile(eager_forward, mode=mode, dynamic=True, backend=compile_backend)
                    r = run_generate(model, case, ids, mask, device, shape, tpf, warmups=2)
                except Exception as err:  # noqa: BLE001
                    rows.append(row("compile", label, name, note=f"error: {err!r}"[:160]))
                    continue
                finally:
                    model.forward = eager_forward
                rows.append(generate_row("compile", label, name, r, first, "eager", "same_tokens_as_eager",
                                         backend=compile_backend))
                first = first or r
    finally:
        model.forward = eager_forward
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


def bench_tests(paths: list[str], rows, limit: float) -> None:
    """``pytest -m gpu`` on ``paths`` in a child process (killed at the section's limit)."""
    import re
    import subprocess

    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *paths]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=max(1.0, limit - 2))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    summary = [ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed|skipped|deselected|error)", ln)]
    note = summary[-1].strip("= ") if summary else f"no summary (exit {proc.returncode})"
    rows.append(row("tests", "pytest -m gpu " + " ".join(paths), "-", note=note,
                    extra={"returncode": proc.returncode, "tail": out[-3000:]}))
    if proc.returncode not in (0, 5):  # 5: no test collected (every path deselected)
        raise RuntimeError(f"pytest -m gpu exited {proc.returncode}: {note}")


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
    ap.add_argument("--sections", default=None, help=f"comma-separated, in order (default: {','.join(SECTIONS)}; "
                    "--dry leaves out tests)")
    ap.add_argument("--backends", default="sdpa,flex", help="attention backends to compare (first = reference)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--budget", type=float, default=None, help="total seconds for all sections")
    ap.add_argument("--tpf", type=int, default=4, help="tokens each forward commits per row in e2e and compile "
                    "(random weights commit none by confidence)")
    ap.add_argument("--compile-backend", default=None, help="torch.compile backend (default: inductor; eager "
                    "with --dry)")
    ap.add_argument("--test-paths", default="tests", help="what the tests section runs pytest -m gpu on")
    ap.add_argument("--host-reads", action=argparse.BooleanOptionalAction, default=None, help="count the host "
                    "synchronisations per forward in e2e (one more run per case; default: with --dry)")
    args = ap.parse_args(argv)
    check_output_args(ap, args.json)
    if args.tpf < 1:
        ap.error("--tpf is a positive number of tokens per forward")

    shape = dict(DRY if args.dry else FULL)
    device = torch.device(args.device or shape["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: run with --dry for the CPU smoke test", file=sys.stderr)
        return 2
    dtype = DTYPES[shape["dtype"]]
    default_sections = [s for s in SECTIONS if not (args.dry and s == "tests")]
    sections = [s for s in args.sections.split(",") if s] if args.sections is not None else default_sections
    backends = [b for b in args.backends.split(",") if b]
    compile_backend = args.compile_backend or ("eager" if args.dry else "inductor")
    start = time.monotonic()
    deadline = start + (shape["budget"] if args.budget is None else args.budget)
    rows, status = [], {}
    meta = {"dry": args.dry, "device": str(device), "dtype": shape["dtype"], "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
            "shape": {k: v for k, v in shape.items() if k != "timeouts"}, "backends": backends, "tpf": args.tpf,
            "compile_backend": compile_backend, "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
            "env": {k: os.environ[k] for k in ("DLLM_ATTN_BACKEND", "TRITON_INTERPRET") if k in os.environ}}

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
                elif name == "e2e":
                    bench_e2e(shape, device, dtype, backends, args.tpf, rows, deadline, meta,
                              host_reads=args.dry if args.host_reads is None else args.host_reads)
                elif name == "compile":
                    bench_compile(shape, device, dtype, args.tpf, rows, deadline, compile_backend)
                else:
                    bench_tests(args.test_paths.split(","), rows, limit)
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
