"""The fused confidence-statistics kernel against its PyTorch reference.

CPU: the kernel runs under Triton's interpreter in a subprocess (``TRITON_INTERPRET=1`` must be set
before triton is imported, and this pytest process may import triton elsewhere without it). The
subprocess is this file run as a script: it rebuilds the deterministic inputs, runs the kernel
(directly, through ``dllm.decoding.sampling`` with ``DLLM_FORCE_TRITON=1``, and inside
``model.generate``) and saves the outputs; the tests below recompute the PyTorch reference here
and compare. CUDA: the ``gpu`` tests run the compiled kernel directly (vocab 126464).

Tolerances (docs/kernels.md): decisions (argmax token, Gumbel sample, accepted sets, generated
tokens) identical; probabilities / margin within 1e-12 and entropy within 1e-10 with fp64
accumulation; probabilities within 2e-6 and entropy within 1e-5 * max(1, H) with fp32.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dllm.decoding.kernels.confidence import (
    benchmark_confidence,
    confidence_stats,
    confidence_stats_reference,
    confidence_stats_triton,
    interpreter_mode,
    triton_available,
    use_triton_kernels,
)
from dllm.decoding.policies import select_factor, select_threshold
from dllm.decoding.sampling import dream_choice, entropy, llada_choice

ROOT = Path(__file__).resolve().parents[2]
WORKER = "--interpreter-worker"
TOL = {"fp64": {"prob": 1e-12, "ent": 1e-10}, "fp32": {"prob": 2e-6, "ent": 1e-5}}
TEMPERATURE = 0.7
SHAPES = [(n, v) for n in (1, 7, 33) for v in (17, 180, 1000, 5003)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
GRID = [(n, v, d) for (n, v) in SHAPES for d in DTYPES]
TAUS = (0.05, 0.3, 0.6, 0.9)


def _key(*parts) -> str:
    return "-".join(str(p) for p in parts)


def _inputs(n: int, v: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits spread enough for confidences across (0, 1], and float64 U(0,1) noise."""
    g = torch.Generator().manual_seed(1000 * n + v + seed)
    scale = torch.rand(n, 1, generator=g) * 6 + 0.5
    x = (torch.randn(n, v, generator=g) * scale).to(dtype)
    u = torch.rand(n, v, dtype=torch.float64, generator=g)
    return x, u


def _tied(v: int = 5003) -> torch.Tensor:
    """Rows whose maximum occurs several times (in different lanes and chunks of the kernel)."""
    x = torch.randn(3, v, generator=torch.Generator().manual_seed(5))
    x[0, [7, 1030, v - 1]] = 9.0
    x[1, [v - 2, v - 1]] = 9.0
    x[2, :] = 0.25                                        # all equal: token 0, margin 0, entropy log V
    return x


def _with_neg_inf(v: int = 1000) -> torch.Tensor:
    x = torch.randn(4, v, generator=torch.Generator().manual_seed(6)) * 3
    x[0, ::2] = float("-inf")
    x[1, : v - 1] = float("-inf")                         # one finite entry: p = 1, entropy 0
    x[2, 1:] = float("-inf")
    return x


def _strided() -> tuple[torch.Tensor, torch.Tensor]:
    """A [B, L, V] slice whose rows cannot be flattened without a copy, and a row selection."""
    base = torch.randn(3, 9, 300, generator=torch.Generator().manual_seed(7)) * 4
    return base[:, 2:7], torch.tensor([0, 3, 4, 9, 14, 2])


def _strided_noise(xs: torch.Tensor) -> torch.Tensor:
    return torch.rand(*xs.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(9))


E2E = {  # name: (model, generate kwargs)
    "threshold": ("llada", {"strategy": "threshold", "threshold": 0.7}),
    "threshold-dual": ("llada", {"strategy": "threshold", "threshold": 0.7, "cache": "dual"}),
    "threshold-sampled": ("llada", {"strategy": "threshold", "threshold": 0.8, "temperature": 1.0, "seed": 7}),
    "vanilla-random": ("llada", {"strategy": "vanilla", "remasking": "random", "seed": 3}),
    "factor-dual": ("llada", {"strategy": "factor", "cache": "dual"}),
    "entropy": ("llada", {"strategy": "entropy", "steps": 16}),
    "margin": ("llada", {"strategy": "margin", "steps": 16, "cache": "prefix"}),
    "maskgit_plus": ("dream", {"strategy": "maskgit_plus", "steps": 16}),
    "d3llm": ("llada", {"strategy": "d3llm", "entropy_threshold": 1.0}),
    "d2f": ("bc", {"strategy": "d2f", "skip_threshold": 0.6}),
    "lopa": ("llada", {"strategy": "lopa", "threshold": 0.7}),
}


# under the interpreter (a few ms per kernel row) one case per decoding loop / confidence kind
E2E_CPU = ["threshold", "threshold-sampled", "entropy", "d3llm", "d2f"]


def _models():
    from dllm.testing import tiny_dream, tiny_llada

    return {"llada": tiny_llada(initializer_range=0.5), "dream": tiny_dream(initializer_range=0.5),
            "bc": tiny_llada(initializer_range=0.5, attention_policy="block_causal", block_size=4)}


def _generate(model, kw, device="cpu", new_tokens=8):
    prompt = torch.randint(0, 60, (2, 7), generator=torch.Generator().manual_seed(1)).to(device)
    out = model.generate(prompt, max_new_tokens=new_tokens, block_length=4, stop_at_eos=False,
                         return_dict_in_generate=True, **kw)
    return out.sequences.cpu(), out.num_forwards.cpu()


def _sampling_calls(x: torch.Tensor, seed: int) -> dict:
    """dllm.decoding.sampling's kernel-backed entry points on one input (whatever dispatch decides)."""
    out = {}
    for T in (0.0, 0.9):
        for remasking in ("low_confidence", "random"):
            g = torch.Generator(device=x.device).manual_seed(seed)
            out[_key("llada", T, remasking)] = llada_choice(x, temperature=T, remasking=remasking, generator=g)
    for alg in ("maskgit_plus", "margin", "entropy"):
        out[_key("dream", alg)] = dream_choice(x, alg=alg, temperature=0.0, top_p=None, top_k=None, generator=None)
    out["entropy"] = entropy(x)
    return out


# ---------------------------------------------------------------------------------------------
# the interpreter subprocess


def _worker(path: str) -> None:
    assert interpreter_mode()  # set in the environment before this process started
    torch.set_num_threads(1)
    import dllm.decoding.kernels.confidence as conf_mod

    res: dict = {}
    for n, v, d in GRID:
        x, u = _inputs(n, v, DTYPES[d])
        res[_key("fp64", n, v, d)] = conf_mod.confidence_stats_triton(
            x, temperature=TEMPERATURE, noise=u, precision="fp64")._asdict()
        res[_key("fp32", n, v, d)] = conf_mod.confidence_stats_triton(x, precision="fp32")._asdict()
    x16, _ = _inputs(5, 700, torch.float16)
    res["fp16"] = conf_mod.confidence_stats_triton(x16, precision="fp32")._asdict()
    res["tied"] = conf_mod.confidence_stats_triton(_tied())._asdict()
    res["neg_inf"] = conf_mod.confidence_stats_triton(_with_neg_inf(), precision="fp32")._asdict()
    res["neg_inf_nan"] = conf_mod.confidence_stats_triton(_with_neg_inf(), precision="fp32",
                                                          nan_on_neg_inf=True)._asdict()
    xs, rows = _strided()
    us = torch.rand(len(rows), xs.shape[-1], dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    res["strided"] = conf_mod.confidence_stats_triton(xs, temperature=2.0, noise=_strided_noise(xs))._asdict()
    res["rows"] = conf_mod.confidence_stats_triton(xs, temperature=2.0, noise=us, rows=rows)._asdict()
    res["need_none"] = conf_mod.confidence_stats_triton(xs, need=())._asdict()

    calls = {"n": 0}
    real = conf_mod.confidence_stats_triton

    def counting(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    conf_mod.confidence_stats_triton = counting
    os.environ["DLLM_FORCE_TRITON"] = "1"
    xb, _ = _inputs(6, 1000, torch.bfloat16, seed=1)
    res["sampling"] = _sampling_calls(xb.view(2, 3, 1000), seed=4)
    res["sampling_calls"] = calls["n"]
    models = _models()
    for name in E2E_CPU:
        m, kw = E2E[name]
        before = calls["n"]
        seqs, nf = _generate(models[m], kw)
        res[_key("e2e", name)] = {"sequences": seqs, "num_forwards": nf, "kernel_calls": calls["n"] - before}
    conf_mod.confidence_stats_triton = real
    res["bench"] = benchmark_confidence(3, 257, "bf16", "cpu", repeats=2)
    torch.save(res, path)


@pytest.fixture(scope="module")
def interp(tmp_path_factory):
    if not triton_available():
        pytest.skip("triton is not installed")
    out = tmp_path_factory.mktemp("confidence_interp") / "out.pt"
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("DLLM_DISABLE_TRITON", None)
    env.pop("DLLM_FORCE_TRITON", None)
    proc = subprocess.run([sys.executable, __file__, WORKER, str(out)], check=False, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


@pytest.fixture
def cpu_path(monkeypatch):
    """The PyTorch reference path in this process, whatever the caller's environment says."""
    monkeypatch.setenv("DLLM_DISABLE_TRITON", "1")


def _close(a, b, tol):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.allclose(a.double(), b.double(), rtol=0, atol=tol), (a - b).abs().max()


def _compare(k: dict, ref, precision: str, sample: bool):
    tol = TOL[precision]
    assert torch.equal(k["token"], ref.token)
    _close(k["max_prob"], ref.max_prob, tol["prob"])
    _close(k["margin"], ref.margin, tol["prob"])
    H = ref.entropy.double()
    assert torch.all((k["entropy"].double() - H).abs() <= tol["ent"] * H.clamp(min=1)), (k["entropy"] - ref.entropy)
    if sample:
        assert torch.equal(k["sample"], ref.sample)
        _close(k["sample_prob"], ref.sample_prob, tol["prob"])
    else:
        assert k["sample"] is None and k["sample_prob"] is None


# ---------------------------------------------------------------------------------------------
# interpreter-mode tests


@pytest.mark.parametrize("n,v,d", GRID)
def test_kernel_matches_reference_fp64_with_gumbel_sample(interp, n, v, d):
    x, u = _inputs(n, v, DTYPES[d])
    ref = confidence_stats_reference(x, temperature=TEMPERATURE, noise=u, precision="fp64")
    _compare(interp[_key("fp64", n, v, d)], ref, "fp64", sample=True)
    # the sample is the PyTorch path's sample: gumbel_argmax draws this noise from this generator
    assert torch.equal(ref.sample, (x.double() - TEMPERATURE * torch.log(-torch.log(u))).argmax(-1))


@pytest.mark.parametrize("n,v,d", GRID)
def test_kernel_matches_reference_fp32(interp, n, v, d):
    x, _ = _inputs(n, v, DTYPES[d])
    _compare(interp[_key("fp32", n, v, d)], confidence_stats_reference(x, precision="fp32"), "fp32", sample=False)


@pytest.mark.parametrize("n,v,d", GRID)
def test_accepted_sets_identical(interp, n, v, d):
    x, u = _inputs(n, v, DTYPES[d])
    cand = torch.rand(1, n, generator=torch.Generator().manual_seed(n + v)) < 0.8
    cand[0, 0] = True
    for prec, field in (("fp64", "max_prob"), ("fp64", "sample_prob"), ("fp32", "max_prob"), ("fp32", "margin")):
        ref = confidence_stats_reference(x, temperature=TEMPERATURE, noise=u, precision=prec)._asdict()[field][None]
        got = interp[_key(prec, n, v, d)][field][None]
        for tau in TAUS:
            assert torch.equal(select_threshold(got, cand, tau), select_threshold(ref, cand, tau)), (prec, field, tau)
        assert torch.equal(select_factor(got, cand, 1.0), select_factor(ref, cand, 1.0))


def test_float16_ties_neg_inf_strided_rows(interp):
    x16, _ = _inputs(5, 700, torch.float16)
    _compare(interp["fp16"], confidence_stats_reference(x16, precision="fp32"), "fp32", sample=False)

    tied = interp["tied"]
    assert tied["token"].tolist() == [7, 4995 + 6, 0]     # lowest index among equal maxima, like torch
    assert torch.equal(tied["token"], _tied().argmax(-1))
    assert tied["margin"].tolist() == [0.0, 0.0, 0.0]
    assert tied["entropy"][2].item() == pytest.approx(torch.log(torch.tensor(5003.0, dtype=torch.float64)).item(),
                                                      abs=1e-10)
    _compare(tied, confidence_stats_reference(_tied()), "fp64", sample=False)

    xi = _with_neg_inf()
    got, ref = interp["neg_inf"], confidence_stats_reference(xi, precision="fp32")
    assert torch.equal(got["token"], ref.token)
    assert got["max_prob"][1].item() == 1.0 and got["entropy"][1].item() == 0.0 and got["token"][1].item() == 999
    assert got["max_prob"][2].item() == 1.0 and got["token"][2].item() == 0
    _close(got["max_prob"], ref.max_prob, TOL["fp32"]["prob"])
    _close(got["margin"], ref.margin, TOL["fp32"]["prob"])
    assert torch.isfinite(ref.entropy).all() and got["entropy"][1].item() == 0.0
    assert torch.allclose(got["entropy"], ref.entropy, atol=1e-5)
    # decoding.sampling.entropy counts 0 * log 0 as 0 (the runner sets the mask logit to -inf); the
    # naive -(p * log p).sum, NaN on such rows, stays available on request
    assert torch.isfinite(entropy(xi)).all() and torch.allclose(entropy(xi), ref.entropy, atol=1e-5)
    nan_ref = confidence_stats_reference(xi, precision="fp32", nan_on_neg_inf=True).entropy
    assert torch.isnan(nan_ref[:3]).all() and not torch.isnan(nan_ref[3])
    got_nan = interp["neg_inf_nan"]
    assert torch.equal(torch.isnan(got_nan["entropy"]), torch.isnan(nan_ref))
    assert torch.allclose(got_nan["entropy"], nan_ref, atol=1e-5, equal_nan=True)
    assert torch.equal(got_nan["token"], got["token"]) and torch.equal(got_nan["max_prob"], got["max_prob"])

    xs, rows = _strided()
    us = torch.rand(len(rows), xs.shape[-1], dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    ref_rows = confidence_stats_reference(xs, temperature=2.0, noise=us, rows=rows)
    _compare(interp["rows"], ref_rows, "fp64", sample=True)
    assert torch.equal(ref_rows.token, xs.reshape(-1, xs.shape[-1])[rows].argmax(-1))
    _compare(interp["strided"], confidence_stats_reference(xs, temperature=2.0, noise=_strided_noise(xs)), "fp64",
             sample=True)
    assert interp["strided"]["token"].shape == (3, 5)
    none = interp["need_none"]
    assert none["margin"] is None and none["entropy"] is None and none["max_prob"] is None
    assert torch.equal(none["token"], xs.argmax(-1))


def test_sampling_functions_use_kernel_and_agree(interp, cpu_path):
    xb, _ = _inputs(6, 1000, torch.bfloat16, seed=1)
    ref = _sampling_calls(xb.view(2, 3, 1000), seed=4)
    got = interp["sampling"]
    assert interp["sampling_calls"] == len(ref) == 8     # every entry point went through the kernel
    for name, r in ref.items():
        g = got[name]
        if name == "entropy":
            assert g.dtype == r.dtype == torch.float32 and torch.allclose(g, r, atol=1e-5)
            continue
        (gt, gc), (rt, rc) = g, r
        assert torch.equal(gt, rt), name                   # same token, same Gumbel sample
        assert gc.dtype == rc.dtype and gc.shape == rc.shape, name
        if name.startswith("llada") and name.endswith("random"):
            assert torch.equal(gc, rc), name               # same generator stream afterwards
        elif name.startswith("llada"):
            assert torch.allclose(gc, rc, rtol=0, atol=1e-12), name
        elif name == "dream-entropy":                      # -H vs sum p log(p + 1e-10): <= V * 1e-10 apart
            assert torch.allclose(gc, rc, rtol=0, atol=1e-5 + 1000 * 1e-10), name
        else:
            assert torch.allclose(gc, rc, rtol=0, atol=2e-6), name


@pytest.mark.parametrize("name", E2E_CPU)
def test_generate_identical_with_kernel(interp, cpu_path, name):
    m, kw = E2E[name]
    got = interp[_key("e2e", name)]
    assert got["kernel_calls"] > 0                         # the kernel really decided these tokens
    seqs, nf = _generate(_models()[m], kw)
    assert torch.equal(got["sequences"], seqs)
    assert torch.equal(got["num_forwards"], nf)


def test_benchmark_runs_under_the_interpreter(interp):
    b = interp["bench"]
    assert b["interpreted"] and b["kernel_ms"] > 0 and b["torch_ms"] > 0
    assert b["logit_bytes"] == 3 * 257 * 2 and b["floor_ms"] > 0


# ---------------------------------------------------------------------------------------------
# plain CPU tests (no triton needed)


def test_dispatch(monkeypatch):
    for var in ("DLLM_DISABLE_TRITON", "DLLM_FORCE_TRITON"):
        monkeypatch.delenv(var, raising=False)
    assert not use_triton_kernels("cpu")
    assert use_triton_kernels("cuda") == triton_available()
    assert use_triton_kernels("cpu", force=True) == triton_available()
    assert not use_triton_kernels("cuda", force=False)
    monkeypatch.setenv("DLLM_DISABLE_TRITON", "1")
    assert not use_triton_kernels("cuda")
    monkeypatch.setenv("DLLM_DISABLE_TRITON", "0")
    monkeypatch.setenv("DLLM_FORCE_TRITON", "1")
    assert use_triton_kernels("cpu") == triton_available()


def test_cpu_dispatch_is_the_reference(cpu_path):
    x, u = _inputs(7, 180, torch.float32)
    a = confidence_stats(x, temperature=0.5, noise=u)
    b = confidence_stats_reference(x, temperature=0.5, noise=u)
    for f in a._fields:
        assert torch.equal(getattr(a, f), getattr(b, f)), f


@pytest.mark.skipif(interpreter_mode(), reason="this process runs the interpreter")
def test_kernel_on_cpu_without_interpreter_is_refused():
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        confidence_stats_triton(torch.randn(2, 10))


def test_reference_is_what_sampling_computes(cpu_path):
    """The reference's fp64 statistics are exactly llada_choice's; fp32 ones are Dream's to rounding."""
    x, _ = _inputs(4, 300, torch.bfloat16)
    tok, conf = llada_choice(x, temperature=0.0, remasking="low_confidence", generator=None)
    ref = confidence_stats_reference(x)
    assert torch.equal(ref.token, tok) and torch.allclose(ref.max_prob, conf, rtol=0, atol=1e-15)
    g = torch.Generator().manual_seed(3)
    tok, conf = llada_choice(x, temperature=0.9, remasking="low_confidence", generator=g)
    u = torch.rand(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ref = confidence_stats_reference(x, temperature=0.9, noise=u)
    assert torch.equal(ref.sample, tok) and torch.allclose(ref.sample_prob, conf, rtol=0, atol=1e-15)
    ref32 = confidence_stats_reference(x, precision="fp32")
    for alg, field in (("maskgit_plus", "max_prob"), ("margin", "margin")):
        t, c = dream_choice(x, alg=alg, temperature=0.0, top_p=None, top_k=None, generator=None)
        assert torch.equal(t, ref32.token) and torch.allclose(c, getattr(ref32, field), atol=1e-6)
    assert torch.allclose(entropy(x), ref32.entropy, atol=1e-5)


def test_argument_errors():
    x = torch.randn(3, 10)
    with pytest.raises(ValueError, match="noise"):
        confidence_stats_reference(x, temperature=1.0, noise=torch.rand(3, 10))          # not float64
    with pytest.raises(ValueError, match="need"):
        confidence_stats_reference(x, need=("nope",))
    with pytest.raises(ValueError, match="precision"):
        confidence_stats_reference(x, precision="fp16")


def test_benchmark_dry_run_on_cpu(cpu_path):
    b = benchmark_confidence(4, 257, torch.bfloat16, "cpu", repeats=2)
    assert b["kernel_ms"] is None and b["torch_ms"] > 0 and b["bandwidth_gbs"] > 0
    assert b["logit_bytes"] == 4 * 257 * 2 and b["floor_ms"] == pytest.approx(b["logit_bytes"] / b["bandwidth_gbs"] / 1e6)


@pytest.mark.skipif(interpreter_mode() or not triton_available(), reason="needs triton's compiler (not the interpreter)")
def test_kernel_compiles_for_cuda():
    """Ahead-of-time compile to an sm_90 (H100/H200) cubin, no GPU needed: the real compiler (not only
    the interpreter) accepts the LLaDA (fp64, sampled) and Dream (fp32, entropy) variants."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dllm.decoding.kernels._confidence_triton import _confidence_kernel

    for xdt, fp64, noise in (("*bf16", True, True), ("*bf16", False, False)):
        acc = "*fp64" if fp64 else "*fp32"
        sig = {"x_ptr": xdt, "stride_b": "i64", "stride_l": "i64", "L": "i32", "rows_ptr": "*i64", "u_ptr": "*fp64",
               "temp_ptr": "*fp64", "V": "i32", "tok_ptr": "*i64", "pmax_ptr": acc, "margin_ptr": acc,
               "ent_ptr": acc, "stok_ptr": "*i64", "sprob_ptr": acc}
        consts = {"BLOCK": 1024, "HAS_ROWS": False, "HAS_NOISE": noise, "NEED_MARGIN": True, "NEED_ENT": True,
                  "FP64": fp64, "NAN_ON_NEG_INF": not noise}
        sig.update(dict.fromkeys(consts, "constexpr"))
        try:
            k = triton.compile(ASTSource(fn=_confidence_kernel, signature=sig, constexprs=consts),
                               target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "enable_fp_fusion": False})
        except FileNotFoundError as e:  # a triton build without its bundled ptxas
            pytest.skip(f"no ptxas: {e}")
        assert k.asm["cubin"] and ".local" not in k.asm["ptx"]  # no stack arrays: state stays in registers


# ---------------------------------------------------------------------------------------------
# CUDA

needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and triton_available()), reason="needs CUDA + triton")
V_LLADA = 126464


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("n", [1, 37, 256])
def test_gpu_kernel_matches_reference_large_vocab(dtype, n):
    g = torch.Generator(device="cuda").manual_seed(n)
    x = (torch.randn(n, V_LLADA, device="cuda", generator=g) * 4).to(DTYPES[dtype])
    u = torch.rand(n, V_LLADA, dtype=torch.float64, device="cuda", generator=g)
    for prec in ("fp64", "fp32"):
        k = confidence_stats_triton(x, temperature=0.8, noise=u, precision=prec)
        ref = confidence_stats_reference(x, temperature=0.8, noise=u, precision=prec)
        _compare({f: (None if t is None else t.cpu()) for f, t in k._asdict().items()},
                 type(ref)(*[t.cpu() for t in ref]), prec, sample=True)
        cand = torch.ones(1, n, dtype=torch.bool, device="cuda")
        for tau in TAUS:
            assert torch.equal(select_threshold(k.max_prob[None], cand, tau), select_threshold(ref.max_prob[None], cand, tau))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", list(E2E))
def test_gpu_generate_identical_with_kernel_on_and_off(monkeypatch, name):
    m, kw = E2E[name]
    model = _models()[m].cuda()
    monkeypatch.setenv("DLLM_DISABLE_TRITON", "1")
    off = _generate(model, kw, device="cuda", new_tokens=16)
    monkeypatch.delenv("DLLM_DISABLE_TRITON")
    assert use_triton_kernels("cuda")
    on = _generate(model, kw, device="cuda", new_tokens=16)
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == WORKER:
    _worker(sys.argv[2])
