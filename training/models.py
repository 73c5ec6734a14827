"""Where the weights and the tokenizer a trainer starts from come from, and how a run is exported."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from dllm.errors import CheckpointError
from dllm.loading import load_model, resolve_model_path
from dllm.modeling import DreamConfig, DreamModel, LLaDAConfig, LLaDAModelLM
from dllm.tokenization import UNK_TOKEN, build_tokenizer, load_tokenizer, special_token_ids, tag_origin

from .config import TAG_HEADS, ModelSection


def load_tokenizer_for(section: ModelSection, data_files=(), extra_texts=()):
    """The tokenizer named in the recipe, else the checkpoint's, else one built from the task suites
    (and the words of ``data_files``, the recipe's JSON Lines files, and ``extra_texts``: a train_dataset's)."""
    if section.tokenizer:
        return load_tokenizer(resolve_model_path(section.tokenizer))
    if section.path or section.grow_from:
        path = resolve_model_path(section.path or section.grow_from)
        if not _has_tokenizer(path):
            raise FileNotFoundError(f"{path} has no tokenizer; set model.tokenizer to a tokenizer directory")
        return load_tokenizer(path)
    from .data import suite_texts
    from .files import record_texts

    return build_tokenizer(suite_texts() + record_texts(data_files) + list(extra_texts), pad_numbers=section.pad_numbers,
                           number_tokens=section.number_tokens,
                           number_tags=section.number_tags, number_tag_style=section.number_tag_style,
                           number_tag_digits=section.number_tag_digits,
                           number_tag_context=section.number_tag_context)


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists()


def init_model(section: ModelSection, tokenizer, attention_policy: str | None = None,
               block_size: int | None = None) -> torch.nn.Module:
    """Load ``section.path`` or build a fresh model from ``section.config`` sized to the tokenizer."""
    policy = attention_policy or section.attention_policy
    bsz = block_size or section.block_size
    if section.path and section.grow_from:
        raise ValueError("model.path and model.grow_from are exclusive: grow_from builds model.config and "
                         "copies the checkpoint's layers into it")
    if section.path:
        model = load_model(section.path, attention_policy=policy, block_size=bsz, dtype=section.dtype)
        if section.tokenizer:
            match_vocabulary(model, resolve_model_path(section.path), tokenizer, tag_head=section.tag_head)
        return model.train()
    model_class, config = scratch_config(section, tokenizer, policy, bsz)
    model = model_class(config)
    if section.grow_from:
        source = load_model(section.grow_from, attention_policy=policy, block_size=bsz)
        grow_depth(model, source)
    if section.init_from:
        init_from_checkpoint(model, load_model(section.init_from), tokenizer)
    return model.train()


_ROLES = ("attn_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down")


def init_from_checkpoint(model, source, tokenizer=None, calibration_texts: int = 64) -> dict[str, int]:
    """Start ``model`` from ``source``, a checkpoint of another format: each tensor takes the source's
    tensor of the same role (embedding, final norm, head, and per layer the attention and MLP
    projections and norms, matched through the layers' role accessors) when the shapes agree.

    A role the source lacks keeps its fresh value, except Qwen3's per-head q/k RMSNorm (SDAR), which has
    no LLaDA equivalent: ``norm(q) = w * q / rms(q)`` cannot be the identity, so its weight is set to the
    mean per-head RMS of the source's q (and k) on task-suite text, which keeps the typical attention
    scale (exact where a head's RMS equals the mean). Returns counts of copied / kept tensors.
    """
    copied, kept = 0, 0

    def take(dst, src) -> None:
        nonlocal copied, kept
        if src is not None and dst is not None and dst.weight.shape == src.weight.shape:
            with torch.no_grad():
                dst.weight.copy_(src.weight)
                if getattr(dst, "bias", None) is not None:
                    if getattr(src, "bias", None) is not None and src.bias.shape == dst.bias.shape:
                        dst.bias.copy_(src.bias)
                    else:
                        dst.bias.zero_()
            copied += 1
        else:
            kept += 1

    take(model._embedding(), source._embedding())
    take(model._final_norm(), source._final_norm())
    take(model._head(), source._head())
    src_layers, dst_layers = source._blocks(), model._blocks()
    if len(src_layers) != len(dst_layers):
        raise ValueError(f"model.init_from: the model has {len(dst_layers)} layers and the checkpoint "
                         f"{len(src_layers)}; use grow_from to add layers")
    for dst, src in zip(dst_layers, src_layers, strict=True):
        for role in _ROLES:
            take(dst._m(role), src._m(role))
    if getattr(model.spec, "qk_norm", False) and not getattr(source.spec, "qk_norm", False):
        _calibrate_qk_norm(model, source, tokenizer, calibration_texts)
    return {"copied": copied, "kept": kept}


def _calibrate_qk_norm(model, source, tokenizer, n: int) -> None:
    rms = {}

    def hook(name):
        def fn(module, inputs, output):
            heads = output.view(*output.shape[:-1], -1, model.spec.head_dim)
            rms[name] = heads.pow(2).mean(-1).sqrt().mean().item()
        return fn

    handles = []
    for i, layer in enumerate(source._blocks()):
        handles += [layer._m("q").register_forward_hook(hook(f"{i}.q")),
                    layer._m("k").register_forward_hook(hook(f"{i}.k"))]
    texts = [ex.prompt + " " + ex.answer for ex in _calibration_examples(n)]
    batch = tokenizer(texts, return_tensors="pt", padding=True) if tokenizer is not None else None
    try:
        with torch.no_grad():
            if batch is not None:
                source(batch["input_ids"], attention_mask=batch["attention_mask"])
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        for i, layer in enumerate(model._blocks()):
            for role in ("q", "k"):
                if f"{i}.{role}" in rms:
                    layer._m(f"{role}_norm").weight.fill_(rms[f"{i}.{role}"])


def _calibration_examples(n: int) -> list:
    from dllm.eval.tasks import get_suite, suite_names

    per = max(1, n // len(suite_names()))
    return [ex for name in suite_names() for ex in get_suite(name).examples("train", per, seed=0)]


_QWEN_NAMES = {"attn_out": "o_proj", "ff_proj": "gate_proj", "ff_out": "down_proj"}


def lora_targets(model, names) -> list[str]:
    """A recipe's LoRA target modules in this model's own projection names: LLaDA's ``attn_out``,
    ``ff_proj`` and ``ff_out`` are ``o_proj``, ``gate_proj`` and ``down_proj`` in the Qwen-format
    checkpoints (Dream, DiffuCoder, SDAR, Fast-dLLM v2), so one recipe adapts every family's projections."""
    qwen = any(n.endswith("self_attn.q_proj") for n, _ in model.named_modules())
    return [(_QWEN_NAMES.get(n, n) if qwen else n) for n in names]


def scratch_config(section: ModelSection, tokenizer, attention_policy: str | None = None,
                   block_size: int | None = None):
    """``(model class, config)`` of the fresh model ``section.config`` describes, sized to the tokenizer
    (what :func:`init_model` builds, and what ``training.memory`` counts on the ``meta`` device)."""
    cfg = dict(section.config)
    model_type = cfg.pop("model_type", "llada")
    ids = special_token_ids(tokenizer)
    vocab = len(tokenizer)
    if attention_policy:
        cfg["attention_policy"] = attention_policy
    if block_size:
        cfg["block_size"] = block_size
    if model_type == "llada":
        cfg.setdefault("rope_theta", 10000.0)
        cfg.setdefault("max_sequence_length", 512)
        return LLaDAModelLM, LLaDAConfig(vocab_size=vocab, embedding_size=vocab, **ids, **cfg)
    if model_type == "Dream":
        cfg.setdefault("rope_theta", 10000.0)
        return DreamModel, DreamConfig(vocab_size=vocab, bos_token_id=ids["eos_token_id"], **ids, **cfg)
    if model_type in ("sdar", "Fast_dLLM_Qwen"):
        from dllm.modeling import Fast_dLLM_QwenForCausalLM, FastDLLMQwenConfig, SDARConfig, SDARForCausalLM

        cfg.setdefault("rope_theta", 10000.0)
        cfg.setdefault("max_position_embeddings", 512)
        if model_type == "sdar":  # (the config adds the published folders' remote-code entry points itself)
            return SDARForCausalLM, SDARConfig(vocab_size=vocab, bos_token_id=ids["eos_token_id"], **ids, **cfg)
        return Fast_dLLM_QwenForCausalLM, FastDLLMQwenConfig(vocab_size=vocab, bos_token_id=ids["eos_token_id"],
                                                             **ids, **cfg)
    raise ValueError(f"model.config.model_type={model_type!r}; valid: llada, Dream, sdar, Fast_dLLM_Qwen")


def match_vocabulary(model: torch.nn.Module, checkpoint_dir: Path, tokenizer, tag_head: str = "origin") -> int:
    """Fit a checkpoint loaded with another tokenizer (``model.tokenizer`` names one) to that tokenizer:
    its embedding and head rows are re-indexed by token string, so a token keeps what it learned
    even when a larger vocabulary moves its id. Returns how many tokens are new (0: same vocabulary).

    Without this, a tokenizer whose ids differ from the checkpoint's (e.g. one built with
    ``number_tags``, which adds tokens that sort between the old ones) would silently train on
    the wrong rows."""
    new_vocab = tokenizer.get_vocab()
    rows = model.get_input_embeddings().weight.shape[0]
    if not _has_tokenizer(checkpoint_dir):
        if max(new_vocab.values()) >= rows:
            raise ValueError(f"model.tokenizer has {len(new_vocab)} tokens but {checkpoint_dir} has {rows} embedding "
                             "rows and no tokenizer to match them by; use the checkpoint's tokenizer")
        return 0
    old_vocab = load_tokenizer(checkpoint_dir).get_vocab()
    if old_vocab == new_vocab:
        return 0
    return remap_vocabulary(model, old_vocab, new_vocab, tag_head=tag_head)


def remap_vocabulary(model: torch.nn.Module, old_vocab: dict[str, int], new_vocab: dict[str, int],
                     tag_head: str = "origin") -> int:
    """Re-index the embedding (and untied head) rows of ``model`` from ``old_vocab`` to ``new_vocab``
    (token string -> id). Tokens in both keep their rows. A new number tag starts from the row of
    the empty digit it stands where (``dllm.tokenization.tag_origin``): with
    ``number_tag_style="replace"`` the model then reads a tagged sequence exactly as it read the
    padded one, and predicts the tags where it predicted that empty digit. Other new tokens start
    from the mean row, so their embeddings are typical and their logits average until training
    moves them. Returns the number of new tokens.

    ``tag_head="unk"`` starts the tags' *head* rows from the UNK token's instead, a token the checkpoint
    never had to predict: for tags that no answer contains (``number_tag_context``), the remapped
    model then gives them almost no probability, where the empty digit's row would hand each tag the
    empty digit's logit and split its probability 1 + n_tags ways, a large loss for the first steps.
    The embedding rows start from the empty digit either way."""
    if tag_head not in TAG_HEADS:
        raise ValueError(f"tag_head must be one of {', '.join(TAG_HEADS)}, got {tag_head!r}")
    size = max(new_vocab.values()) + 1
    tokens = sorted(new_vocab, key=new_vocab.get)
    old_ids = torch.tensor([old_vocab.get(t, -1) for t in tokens])
    new_ids = torch.tensor(sorted(new_vocab.values()))
    known = old_ids >= 0
    origin = torch.tensor([old_vocab.get(tag_origin(t) or "", -1) for t in tokens])
    derived = ~known & (origin >= 0)

    def remapped(weight: torch.Tensor, tag_rows: str = "origin") -> torch.nn.Parameter:
        w = weight.detach()
        out = w[: len(old_vocab)].mean(0, keepdim=True).repeat(size, 1)
        out[new_ids[known]] = w[old_ids[known]]
        out[new_ids[derived]] = w[origin[derived]] if tag_rows == "origin" else w[old_vocab[UNK_TOKEN]]
        return torch.nn.Parameter(out, requires_grad=weight.requires_grad)

    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is emb.weight
    if tag_head != "origin" and (head is None or tied):
        raise ValueError(f"tag_head={tag_head!r} sets the tags' head rows apart from their embedding rows; this "
                         "model ties its head to its embedding, so use tag_head='origin'")
    emb.weight = remapped(emb.weight)
    emb.num_embeddings = size
    if head is not None:
        head.weight = emb.weight if tied else remapped(head.weight, tag_head)
        head.out_features = size
    model.config.vocab_size = size
    if getattr(model.config, "embedding_size", None) is not None:
        model.config.embedding_size = size
    model.spec = model.config.core_spec()
    return int((~known).sum())


_LAYER_KEY = re.compile(r"^(.*\.(?:blocks|layers))\.(\d+)\.(.+)$")
# the projections that write a block's result into the residual stream (LLaDA, Dream)
_OUTPUT_PROJECTIONS = {"attn_out", "ff_out", "o_proj", "down_proj"}


_MLP_INPUTS = {"ff_proj", "up_proj", "gate_proj"}
_MLP_OUTPUTS = {"ff_out", "down_proj"}


def _fits(src: torch.Size, tgt: torch.Size, parts: set[str]) -> bool:
    """Same shape, or an MLP weight grown along its hidden dimension only (rows of the input
    projections, columns of the output projection)."""
    if src == tgt:
        return True
    if len(src) != 2 or len(tgt) != 2:
        return False
    hidden_dim = 0 if parts & _MLP_INPUTS else 1 if parts & _MLP_OUTPUTS else None
    return hidden_dim is not None and src[1 - hidden_dim] == tgt[1 - hidden_dim] and src[hidden_dim] < tgt[hidden_dim]


def grow_depth(model: torch.nn.Module, source: torch.nn.Module) -> dict[int, int]:
    """Copy ``source`` into the deeper and/or MLP-wider ``model`` so that both compute the same function.

    Target layer ``i`` takes source layer ``floor(i * L_src / L_tgt)``; every non-first copy of a
    source layer gets its output projections zeroed, which makes it an identity residual block
    until training moves them. A wider MLP hidden layer (``mlp_hidden_size``; LLaDA) or
    ``intermediate_size`` (Dream) keeps the source's units first; the new units keep the model's
    fresh initialisation on their input side (gate, up) and start with zero output weights, so
    they add nothing until trained. Everything outside the layers (embeddings, final norm, head)
    is copied as is. Returns the map target layer -> source layer.
    """
    src_sd, tgt_sd = source.state_dict(), model.state_dict()
    n_src = 1 + max((int(m.group(2)) for k in src_sd if (m := _LAYER_KEY.match(k))), default=-1)
    n_tgt = 1 + max((int(m.group(2)) for k in tgt_sd if (m := _LAYER_KEY.match(k))), default=-1)
    if n_src <= 0 or n_tgt < n_src:
        raise ValueError(f"grow_from: the model has {n_tgt} layers and the checkpoint {n_src}; growing needs "
                         "at least as many layers as the checkpoint")
    mapping = {i: i * n_src // n_tgt for i in range(n_tgt)}
    first_copy = {}
    for i, j in mapping.items():
        first_copy.setdefault(j, i)
    new_sd = {}
    for key, value in tgt_sd.items():
        m = _LAYER_KEY.match(key)
        src_key = f"{m.group(1)}.{mapping[int(m.group(2))]}.{m.group(3)}" if m else key
        parts = set(m.group(3).split(".")) if m else set()
        if src_key not in src_sd or not _fits(src_sd[src_key].shape, value.shape, parts):
            got = tuple(src_sd[src_key].shape) if src_key in src_sd else "missing"
            raise ValueError(f"grow_from: {key} {tuple(value.shape)} has no match in the checkpoint ({src_key}: "
                             f"{got}); only the number of layers and the MLP hidden size may grow")
        w = src_sd[src_key].detach().to(value.dtype)
        if w.shape != value.shape:  # a wider MLP: source units first, new units fresh (inputs) or zero (output)
            grown = value.detach().clone()
            if parts & _MLP_OUTPUTS:
                grown.zero_()
            grown[tuple(slice(0, n) for n in w.shape)] = w
            w = grown
        else:
            w = w.clone()
        duplicate = m is not None and first_copy[mapping[int(m.group(2))]] != int(m.group(2))
        if duplicate and _OUTPUT_PROJECTIONS & set(m.group(3).split(".")):
            w.zero_()
        new_sd[key] = w
    model.load_state_dict(new_sd)
    return mapping


def generation_defaults(tokenizer, max_new_tokens: int, block_size: int | None, start: str | Path | None = None) -> dict:
    """Decoding defaults shipped in ``generation_config.json`` under the ``"dllm"`` key (read by
    ``model.generate``): Fast-dLLM threshold decoding for bidirectional models, the D2F pipeline
    for block-causal ones, both over the canvas length the model was trained for.

    ``start``: the checkpoint training began from. When it has the same attention (bidirectional or
    block-causal), its decoding defaults carry over (a fine-tuned ``tiny-d2f`` keeps its tuned
    ``skip_threshold``), and only what training decides is replaced: the canvas length, the block
    size of a block-causal model and the special ids of the tokenizer."""
    ids = special_token_ids(tokenizer)
    if block_size:
        fields = {"strategy": "d2f", "block_length": int(block_size)}
    else:
        block = 32 if max_new_tokens % 32 == 0 else None
        fields = {"strategy": "threshold", "block_length": block}
    fields.update(max_new_tokens=int(-(-max_new_tokens // (block_size or 1)) * (block_size or 1)),
                  temperature=0.0, remasking="low_confidence", **ids)
    inherited = _start_defaults(start, block_causal=bool(block_size))
    if inherited is not None:
        decided = {"max_new_tokens", *ids, *(("block_length",) if block_size else ())}
        fields = {**inherited, **{k: v for k, v in fields.items() if k in decided}}
    try:  # validate against the generation config when the decoding package is present
        from dllm.decoding.config import FILE_KEY, DiffusionGenerationConfig

        DiffusionGenerationConfig(**fields)
        # only the fields we choose: the rest keep the library's defaults as they evolve
        return {FILE_KEY: fields}
    except ImportError:
        return {"dllm": fields}


def _start_defaults(start, block_causal: bool) -> dict | None:
    """The ``"dllm"`` decoding defaults of the checkpoint ``start`` when its attention matches, else None."""
    if start is None:
        return None
    try:
        path = resolve_model_path(start)
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError, CheckpointError):
        return None
    try:
        saved = json.loads((path / "generation_config.json").read_text()).get("dllm")
    except (OSError, ValueError):
        saved = None
    from dllm.modeling import family_of

    try:
        family = family_of(config)
    except CheckpointError:
        return None
    if not saved:  # a published checkpoint: its family's own decoder (LLaDA2: edit), if it has one
        saved = dict(getattr(family.model_class, "family_decoding", {}) or {}) or None
    attention = config.get("attention_policy") or family.attention
    if not saved or (attention == "block_causal") != block_causal:
        return None
    return dict(saved)


def export_model(model, tokenizer, out_dir: Path, gen_defaults: dict, info: dict,
                 state_dict: dict | None = None) -> Path:
    """``save_pretrained`` (safetensors) + tokenizer + generation defaults + training info into ``out_dir``.

    ``state_dict``: full weights gathered from a sharded (ZeRO-3) model, else the model's own.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(str(out_dir))
    gen_file = out_dir / "generation_config.json"
    from dllm.modeling.published import PublishedLayoutConfig

    if isinstance(getattr(model, "config", None), PublishedLayoutConfig) and gen_file.exists():
        # a format with a published layout keeps its transformers keys (EOS list, ...) beside dllm's
        gen_defaults = {**{k: v for k, v in json.loads(gen_file.read_text()).items() if k != "dllm"}, **gen_defaults}
    gen_file.write_text(json.dumps(gen_defaults, indent=2) + "\n")
    (out_dir / "training_info.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    return out_dir
