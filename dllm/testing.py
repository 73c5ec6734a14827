"""Tiny random models for tests and examples (a few thousand parameters, CPU-fast), and two probes of a
decoding run: :func:`forced_commits` (random weights that commit a set number of tokens per forward) and
:class:`HostReads` (the host synchronisations a GPU would make, counted on CPU)."""

from __future__ import annotations

import collections
import contextlib
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from .modeling import DreamConfig, DreamModel, LLaDAConfig, LLaDAModelLM

VOCAB = 64
MASK = 63
EOS = 62
PAD = 61


def tiny_llada(seed: int = 0, **overrides) -> LLaDAModelLM:
    cfg = dict(
        d_model=48, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden_size=96, vocab_size=VOCAB,
        embedding_size=VOCAB, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, rope_theta=10000.0,
    )
    cfg.update(overrides)
    torch.manual_seed(seed)
    return LLaDAModelLM(LLaDAConfig(**cfg)).eval()


def tiny_dream(seed: int = 0, **overrides) -> DreamModel:
    cfg = dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=EOS,
        rope_theta=10000.0,
    )
    cfg.update(overrides)
    torch.manual_seed(seed)
    return DreamModel(DreamConfig(**cfg)).eval()


def tiny_tokenizer():
    """A word-level tokenizer over the task suites' texts (built, not downloaded)."""
    from dllm.eval.tasks import get_suite, suite_names

    from .tokenization import build_tokenizer

    texts = []
    for name in suite_names():
        for ex in get_suite(name).examples("train", 200, seed=0) + get_suite(name).examples("test", 50, seed=0):
            texts += [ex.prompt, ex.answer]
    return build_tokenizer(texts)


def save_tiny_checkpoint(directory, *, block_causal: bool = False, block_size: int = 8, seed: int = 0,
                         initializer_range: float = 0.5, generation_config=None):
    """A random LLaDA-format checkpoint + tokenizer in ``directory``; returns (model, tokenizer)."""
    from .tokenization import special_token_ids

    tok = tiny_tokenizer()
    ids = special_token_ids(tok)
    extra = {"attention_policy": "block_causal", "block_size": block_size} if block_causal else {}
    model = tiny_llada(seed=seed, vocab_size=len(tok), embedding_size=len(tok), initializer_range=initializer_range,
                       **ids, **extra)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    if generation_config is not None:
        generation_config.save_pretrained(directory)
    return model, tok


# --- tiny mixture-of-experts checkpoints in the published formats -------------------------------------
# Shapes are tiny; every config key and tensor name is the published checkpoints'. The vocabulary is the
# bundled tokenizer's, so these checkpoints also decode, serve and train on the task suites.
MOE_FAMILIES = ("llada2", "llada-moe", "sdar-moe")
# keys of the published config.json files that dllm's config classes do not read (kept on save)
_LLADA2_EXTRA_KEYS = {
    "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                 "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                 "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
    "embedding_dropout": 0.0, "attention_dropout": 0.0, "output_dropout": 0.0, "norm_head": False,
    "max_window_layers": 20, "sliding_window": 4096, "output_router_logits": False, "router_dtype": "fp32",
    "using_split_qkv_in_self_attention": False,
}
_SDAR_MOE_EXTRA_KEYS = {
    "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu", "initializer_range": 0.02,
    "max_window_layers": 48, "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": False, "use_sliding_window": False,
}
_LLADA_MOE_EXTRA_KEYS = {
    "auto_map": {"AutoConfig": "configuration_lladamoe.LLaDAConfig", "AutoModel": "modeling_lladamoe.LLaDAMoEModelLM",
                 "AutoModelForCausalLM": "modeling_lladamoe.LLaDAMoEModelLM"},
    "attention_dropout": 0.0, "output_router_logits": False, "router_aux_loss_coef": 0.01,
    "router_num_group": None, "router_topk_group": None,
}


def tiny_moe_config(family: str, **overrides):
    """The config of a tiny ``llada2``, ``llada-moe`` or ``sdar-moe`` checkpoint with the bundled tokenizer's ids."""
    from .modeling import LLaDA2MoeConfig, LLaDAMoEConfig, SDARMoeConfig

    ids = {"vocab_size": 402, "mask_token_id": 3, "eos_token_id": 2, "pad_token_id": 0}
    if family == "llada2":
        cfg = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.5, num_experts=16, n_group=4,
                   topk_group=2, num_experts_per_tok=4, moe_intermediate_size=16, num_shared_experts=1,
                   first_k_dense_replace=1, routed_scaling_factor=2.5, rope_theta=600000.0, block_size=8,
                   max_position_embeddings=512, architectures=["LLaDA2MoeModelLM"], **ids, **_LLADA2_EXTRA_KEYS)
        cfg.update(overrides)
        return LLaDA2MoeConfig(**cfg)
    if family == "llada-moe":
        cfg = dict(hidden_size=32, dense_intermediate_size=48, expert_intermediate_size=16,
                   shared_expert_intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=4, num_experts=16, num_experts_per_tok=4, moe_layer_freq=[0, 1, 1],
                   qk_layernorm=True, moe_router_enable_expert_bias=True, moe_router_score_function="softmax",
                   norm_topk_prob=False, rope_theta=50000.0, partial_rotary_factor=1.0, max_position_embeddings=512,
                   architectures=["LLaDAMoEModelLM"], **ids, **_LLADA_MOE_EXTRA_KEYS)
        cfg.update(overrides)
        return LLaDAMoEConfig(**cfg)
    if family == "sdar-moe":
        # Qwen3-MoE's keys; layer 1 is dense (mlp_only_layers), so the checkpoint has both kinds of layer
        cfg = dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=16, num_experts_per_tok=4,
                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1], block_size=4,
                   rope_theta=1000000.0, max_position_embeddings=512, architectures=["SDARMoeForCausalLM"],
                   **{**ids, "bos_token_id": 2}, **_SDAR_MOE_EXTRA_KEYS)
        cfg.update(overrides)
        return SDARMoeConfig(**cfg)
    raise ValueError(f"family={family!r}; valid: {', '.join(MOE_FAMILIES)}")


def _tiny_moe_value(name: str, shape, gen: torch.Generator, scale: float) -> torch.Tensor:
    noise = torch.randn(shape, generator=gen)
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return 1.0 + 0.1 * noise
    if name.endswith("expert_bias"):
        return 0.05 * noise
    if name.endswith("mlp.gate.weight"):  # decisive routing: tokens should not sit on a tie between experts
        return noise
    fan_in = shape[-1] if len(shape) > 1 else 1
    return scale * noise / fan_in ** 0.5


def tiny_moe_model(family: str, seed: int = 0, scale: float = 1.0, **overrides):
    """A tiny random model of ``family`` whose weights depend only on ``seed`` and ``scale`` (each
    tensor drawn in sorted-name order, whatever the order the modules are built in)."""
    from .modeling import LLaDA2MoeModelLM, LLaDAMoEModelLM, SDARMoeForCausalLM

    config = tiny_moe_config(family, **overrides)
    model = {"llada2": LLaDA2MoeModelLM, "llada-moe": LLaDAMoEModelLM, "sdar-moe": SDARMoeForCausalLM}[family](config)
    gen = torch.Generator().manual_seed(seed)
    state = {name: _tiny_moe_value(name, t.shape, gen, scale) for name, t in sorted(model.state_dict().items())}
    if family == "llada2":  # the reference zeroes the padding row at init; keep it that way
        state["model.word_embeddings.weight"][config.pad_token_id] = 0.0
    model.load_state_dict(state)
    return model.eval()


def save_tiny_moe_checkpoint(directory, family: str, seed: int = 0, scale: float = 1.0,
                             max_shard_size: str = "200KB", **overrides):
    """A tiny ``family`` checkpoint in its published layout (sharded safetensors + index, config.json,
    the bundled tokenizer) in ``directory``; returns the model."""
    import json
    from pathlib import Path

    from .loading import resolve_model_path
    from .text import load_tokenizer_for

    model = tiny_moe_model(family, seed=seed, scale=scale, **overrides)
    model.save_pretrained(str(directory), max_shard_size=max_shard_size)
    load_tokenizer_for(resolve_model_path("tiny")).save_pretrained(str(directory))
    # a published checkpoint carries no dllm decoding defaults: drop the ones save_pretrained wrote
    gen = Path(directory) / "generation_config.json"
    if gen.exists():
        data = json.loads(gen.read_text())
        data.pop("dllm", None)
        gen.write_text(json.dumps(data, indent=2) + "\n")
    model._diffusion_generation_config = None  # re-derived from the family's defaults
    return model


# --- tiny block-diffusion checkpoints in the published formats (SDAR, Fast-dLLM v2, Dream/DiffuCoder) ---------
# Every config key is the published checkpoints' (SDAR-4B-Chat, Fast_dLLM_v2_7B, Dream-v0 / DiffuCoder-7B),
# the shapes are tiny and the vocabulary is the bundled tokenizer's (so they decode, serve and train on the
# task suites). SDAR gets an explicit head_dim different from hidden_size / heads, as the released sizes have.
BLOCK_FAMILIES = ("sdar", "fast-dllm-v2", "diffucoder")
_BUNDLED_IDS = {"vocab_size": 402, "mask_token_id": 3, "eos_token_id": 2, "pad_token_id": 0, "bos_token_id": 2}
_SDAR_KEYS = {
    "architectures": ["SDARForCausalLM"], "auto_map": None, "attention_bias": False, "attention_dropout": 0.0,
    "attn_implementation": "flex_attention", "debug": False, "ep_size": 1, "fuse_cross_entropy": True,
    "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 32768, "max_window_layers": 36,
    "micro_forward": False, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "skip_checkpoint": False, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": False, "use_deepep": False, "use_sliding_window": False,
}
_FAST_KEYS = {
    "architectures": ["Fast_dLLM_QwenForCausalLM"],
    "auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig", "AutoModel": "modeling.Fast_dLLM_QwenModel",
                 "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
    "attention_dropout": 0.0, "conplemenrary_mask": True, "hidden_act": "silu", "initializer_range": 0.02,
    "max_position_embeddings": 32768, "max_window_layers": 28, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "use_sliding_window": False,
}
_DREAM_KEYS = {
    "architectures": ["DreamModel"],
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "attention_dropout": 0.0, "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 131072,
    "max_window_layers": 28, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False,
}


def tiny_block_config(family: str, **overrides):
    """The config of a tiny ``sdar``, ``fast-dllm-v2`` or ``diffucoder`` (Dream format) checkpoint."""
    from .modeling import DreamConfig, FastDLLMQwenConfig, SDARConfig
    from .modeling.sdar import AUTO_MAP

    shape = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)
    if family == "sdar":
        cfg = {**_SDAR_KEYS, "auto_map": AUTO_MAP, **shape, "head_dim": 16, "block_size": 4, **_BUNDLED_IDS}
        cfg.update(overrides)
        return SDARConfig(**cfg)
    if family == "fast-dllm-v2":
        cfg = {**_FAST_KEYS, **shape, "bd_size": 8, **_BUNDLED_IDS}
        cfg["layer_types"] = ["full_attention"] * cfg["num_hidden_layers"]
        cfg.update(overrides)
        return FastDLLMQwenConfig(**cfg)
    if family == "diffucoder":
        cfg = {**_DREAM_KEYS, **shape, **_BUNDLED_IDS}
        cfg.update(overrides)
        return DreamConfig(**cfg)
    raise ValueError(f"family={family!r}; valid: {', '.join(BLOCK_FAMILIES)}")


def tiny_block_model(family: str, seed: int = 0, scale: float = 1.0, silent: tuple[int, ...] = (), **overrides):
    """A tiny random ``family`` model whose weights depend only on ``seed`` and ``scale`` (tensors drawn in
    sorted-name order). ``silent``: token ids whose LM-head row is zero (never the argmax in practice:
    reference decoders commit [MASK] or stop at EOS where dllm reads the canvas)."""
    from .modeling import DreamModel, Fast_dLLM_QwenForCausalLM, SDARForCausalLM

    config = tiny_block_config(family, **overrides)
    cls = {"sdar": SDARForCausalLM, "fast-dllm-v2": Fast_dLLM_QwenForCausalLM, "diffucoder": DreamModel}[family]
    model = cls(config)
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, t in sorted(model.state_dict().items()):
        noise = torch.randn(t.shape, generator=gen)
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            state[name] = 1.0 + 0.1 * noise
        elif name.endswith(".bias"):
            state[name] = 0.1 * noise
        else:
            state[name] = scale * noise / (t.shape[-1] if t.dim() > 1 else 1) ** 0.5
    for token in silent:
        state["lm_head.weight"][token] = 0.0
    model.load_state_dict(state)
    return model.eval()


def save_tiny_block_checkpoint(directory, family: str, seed: int = 0, scale: float = 1.0, silent=(),
                               max_shard_size: str = "40KB", **overrides):
    """A tiny ``family`` checkpoint in its published layout (sharded safetensors + index, config.json,
    generation_config.json with the published EOS list, the bundled tokenizer) in ``directory``."""
    import json
    from pathlib import Path

    from .loading import resolve_model_path
    from .text import load_tokenizer_for

    model = tiny_block_model(family, seed=seed, scale=scale, silent=silent, **overrides)
    model.save_pretrained(str(directory), max_shard_size=max_shard_size)
    eos = model.config.eos_token_id
    gen = {"bos_token_id": model.config.bos_token_id, "do_sample": True, "eos_token_id": [eos],
           "pad_token_id": model.config.pad_token_id, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
           "transformers_version": "4.51.0"}
    (Path(directory) / "generation_config.json").write_text(json.dumps(gen, indent=4) + "\n")
    load_tokenizer_for(resolve_model_path("tiny")).save_pretrained(str(directory))
    return model


@contextlib.contextmanager
def forced_commits(model, k: int, mask_id: int, token: int):
    """Every forward makes the first ``k`` masked slots of each row it returns logits for confident (+30 on
    ``token``'s logit, a probability of about 1 against random logits), so a confidence rule commits ``k``
    tokens per row and step, as a trained model commits several. The logits' column ``c`` is input
    position ``logits_range[0] + c`` (the model applies Dream's shift itself)."""

    def hook(module, args, kwargs, output):
        ids = kwargs.get("input_ids")
        if ids is None or k <= 0:
            return
        a, b = kwargs.get("logits_range") or (0, ids.shape[1])
        masked = ids[:, a:b] == mask_id
        first = masked & (masked.cumsum(1) <= k)
        output.logits[..., token] += 30.0 * first.to(output.logits.dtype)

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        yield model
    finally:
        handle.remove()


_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
          torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero, torch.Tensor.numpy}
# tensors made from Python values: on the host unless a device is named
_FACTORIES = {torch.zeros, torch.ones, torch.full, torch.empty, torch.tensor, torch.as_tensor, torch.arange,
              torch.rand, torch.randn, torch.randint, torch.eye, torch.linspace}


class HostReads(TorchFunctionMode):
    """Counts, on CPU, the reads of tensor values by Python that a GPU run would wait for (``.item()``,
    ``bool(t)``, ``.tolist()``, ``.nonzero()``, ``.cpu()``, ...), by the file and line that made them.

    On a CPU every tensor is already on the host, so this mode tracks where a GPU run's tensors would be:
    a tensor made by ``.cpu()`` is a host tensor (the mode returns a copy, as a GPU run would), and so is
    whatever is computed from host tensors alone; reading any other tensor is a synchronisation. A tensor
    made from Python values (``torch.zeros``, ``torch.tensor``, ...) is a host tensor unless the call names a
    ``device`` (``device=x.device`` is a GPU on a GPU run); ``.to(device)`` of a host tensor makes a device
    copy, ``.to("cpu")`` a host one.
    """

    def __init__(self, root: str | None = None) -> None:  # root: a folder whose frames name the reads
        super().__init__()
        self.reads: collections.Counter = collections.Counter()
        self._token = object()  # marks this mode's host tensors (storage addresses are reused once freed)
        self._root = root

    @property
    def total(self) -> int:
        return sum(self.reads.values())

    def _on_host(self, t: torch.Tensor) -> bool:
        return getattr(t, "_dllm_host_reads", None) is self._token

    def _mark(self, t: torch.Tensor) -> None:
        t._dllm_host_reads = self._token

    @staticmethod
    def _names_device(args, kwargs) -> bool:
        """Whether a ``Tensor.to`` call moves to a device (not just a dtype)."""
        return "device" in kwargs or (bool(args) and isinstance(args[0], (torch.device, str, torch.Tensor)))

    def _count(self, what: str) -> None:
        """One read, at the innermost frame outside torch (under ``root`` where given)."""
        frames = [f for f in traceback.extract_stack(limit=24)[:-2] if "/torch/" not in f.filename]
        if self._root is not None:
            frames = [f for f in frames if f.filename.startswith(self._root)] or frames
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
        self.reads[(what, where)] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        if func is torch.Tensor.cpu:
            if not self._on_host(args[0]):
                self._count("cpu")
            out = func(*args, **kwargs)
            if out.untyped_storage().data_ptr() == args[0].untyped_storage().data_ptr():
                out = out.clone()  # on CPU .cpu() returns the tensor itself: a copy, as from a GPU
            self._mark(out)
            return out
        if func is torch.Tensor.to and self._names_device(args[1:], kwargs):
            target = kwargs.get("device", args[1] if len(args) > 1 else None)
            if target == "cpu":  # a host copy (then any dtype change, on the host)
                out = self.__torch_function__(torch.Tensor.cpu, types, (args[0],))
                out = out.to(*args[2:], **{k: v for k, v in kwargs.items() if k != "device"})
                self._mark(out)
                return out
            out = func(*args, **kwargs)
            if out.untyped_storage().data_ptr() == args[0].untyped_storage().data_ptr():
                out = out.clone()  # on CPU .to(device) may return the tensor itself: a device copy on a GPU
            return out
        host = bool(tensors) and all(self._on_host(t) for t in tensors)
        if func in _FACTORIES and not tensors and "device" not in kwargs:
            host = True
        if func in _READS and tensors and not host:
            self._count(getattr(func, "__name__", str(func)))
        out = func(*args, **kwargs)
        if host:
            for o in tree_flatten(out)[0]:
                if isinstance(o, torch.Tensor):
                    self._mark(o)
        return out
