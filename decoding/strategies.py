"""The built-in strategies: each a :class:`~dllm.decoding.registry.Strategy` record naming its loop, its commit
policy and its capabilities. Registered when ``dllm.decoding`` is imported."""

from __future__ import annotations

import math

from .commit import Entropy, Factor, Margin, MaskGitPlus, Quota, Threshold
from .errors import GenerationConfigError
from .loops.editing import decode_edit
from .loops.fast_dllm_v2 import decode_fast_dllm_v2
from .loops.pipeline import D2FRule, EntropyRule, decode_pipeline
from .loops.sdar import decode_sdar
from .loops.semi_ar import decode_semi_ar
from .lopa import decode_lopa
from .registry import Strategy, register_strategy

_CACHED = frozenset({"cache", "refresh_interval", "dual_cache_step_bound"})
_LLADA = frozenset({"remasking"}) | _CACHED
_D2F = frozenset({"block_add_threshold", "decoded_token_threshold", "skip_threshold", "d2f_confidence"})


def _vanilla_steps(cfg) -> str | None:
    if cfg.steps is not None and cfg.steps % cfg.num_blocks:
        return (f"steps={cfg.steps} must be a multiple of the number of blocks ({cfg.num_blocks} = "
                "max_new_tokens / block_length, rounded up)")
    return None


def _fast_dllm_v2_cache(model, cfg) -> None:
    if cfg.cache == "prefix":
        raise GenerationConfigError(
            "strategy='fast_dllm_v2' caches finished blocks exactly by itself; cache='dual' reuses the block's "
            "K/V inside a block (the reference's use_block_cache), cache='none' recomputes the block each step"
        )


def _lopa_refresh(model, cfg) -> None:
    if not model.is_block_causal and cfg.refresh_interval:
        raise GenerationConfigError(
            "strategy='lopa' on a bidirectional model does not support refresh_interval: a refresh in the middle of "
            "a block would bake one branch's lookahead token into every slot's cache"
        )


def _lopa_joins(cfg) -> bool:
    """On either base rule (D2F: before every round; threshold: at block starts) with the single-process
    executor, which re-lays out every branch group; ``DecodeSession`` keeps a batch whose branches run on
    a branch executor (branch parallelism: ranks that re-lay out nothing) from taking rows."""
    return True


def _threshold_as_d2f(model, cfg):
    """On a block-causal model without a cache, a ``threshold`` row decodes exactly as a ``d2f`` row that
    appends a block only once the last one is full (tau_add = 1, so every new block is fully activated):
    the same forwards (a step feeds the current block against the exact cache, and the first step of a
    block also feeds the finished one before it) and the same commits (every slot above the threshold,
    else the best one by probability). Fast-dLLM's ``conf >= t`` is D2F's strict ``conf > t'`` with t'
    the float64 just below t (confidences are float64 probabilities). D2F stops appending blocks after an
    EOS, so rows that go on past their EOS (``stop_at_eos=False``) keep their own loop."""
    if (not getattr(model, "is_block_causal", False) or cfg.cache != "none" or cfg.cfg_scale or cfg.remasking != "low_confidence"
            or not cfg.stop_at_eos or cfg.threshold <= 0):
        return None
    return "d2f", {"skip_threshold": math.nextafter(cfg.threshold, -math.inf), "block_add_threshold": 1.0,
                   "decoded_token_threshold": 1.0, "d2f_confidence": "prob"}


def _edit_post_steps(cfg) -> int:
    """Up to ``max_post_steps`` edit-only forwards per block, one block more."""
    return (cfg.num_blocks + 1) * (cfg.max_post_steps + 1) + 2 * cfg.block_size


_SEMI_AR = dict(loop=decode_semi_ar, joins_rows=True, exact_replay=True)
BUILTIN = [
    Strategy("vanilla", summary="LLaDA semi-AR decoding: a fixed per-block token quota over `steps`",
             options=_LLADA | {"steps", "cfg_scale"}, policy=Quota, guidance=True, validate=_vanilla_steps,
             threshold_option=None, row_options=frozenset({"temperature"}), **_SEMI_AR),
    Strategy("threshold", summary="Fast-dLLM: commit every masked token with confidence >= threshold (+ the best)",
             options=_LLADA | {"threshold"}, policy=Threshold, row_options=frozenset({"threshold", "temperature"}),
             batches_as=_threshold_as_d2f, **_SEMI_AR),
    Strategy("factor", summary="Fast-dLLM factor rule: accept the k best while c_k >= 1 - factor/(k+1)",
             options=_LLADA | {"factor"}, policy=Factor, threshold_option=None,
             row_options=frozenset({"temperature"}), **_SEMI_AR),
    *(Strategy(policy.alg, summary=f"Dream: timestep schedule, positions ranked by {rank}",
               options=_CACHED | {"steps", "eps", "alg_temp"}, policy=policy, threshold_option=None, **_SEMI_AR)
      for policy, rank in ((Entropy, "negative entropy"), (Margin, "top1 - top2 probability"),
                           (MaskGitPlus, "max probability"))),
    Strategy("d3llm", decode_pipeline,
             "d3LLM: pipelined multi-block decoding, commit tokens with entropy <= entropy_threshold",
             frozenset({"entropy_threshold", "block_add_threshold", "decoded_token_threshold", "cache", "cache_delay",
                        "refresh_interval"}), policy=EntropyRule, threshold_option=None, joins_rows=True),
    Strategy("d2f", decode_pipeline,
             "D2F: pipelined multi-block decoding with an exact block KV cache (tau_add/tau_act/tau_conf)", _D2F,
             policy=D2FRule, requires_block_causal=True, joins_rows=True, exact_replay=True,
             threshold_option="skip_threshold",
             row_options=frozenset({"skip_threshold", "block_add_threshold", "decoded_token_threshold",
                                    "temperature"})),
    Strategy("edit", decode_edit,
             "LLaDA2.1 token editing (SGLang's joint_threshold): commit masks above threshold (M2T) and "
             "replace committed tokens of the current block the model now prefers above editing_threshold (T2T)",
             frozenset({"threshold", "editing_threshold", "max_post_steps"}), requires_block_causal=True,
             joins_rows=True, extra_forwards=_edit_post_steps),
    Strategy("sdar", decode_sdar,
             "SDAR/TraDo block decoding on the model's own blocks: denoising_steps per block, "
             "low-confidence remasking (dynamic: every token above threshold, at least the step's quota)",
             frozenset({"threshold", "denoising_steps", "unmasking"}), requires_block_causal=True, grid="position",
             joins_rows=True, exact_replay=True),
    Strategy("fast_dllm_v2", decode_fast_dllm_v2,
             "Fast-dLLM v2: sub-blocks decoded by confidence threshold inside the model's blocks, the next "
             "block's first token from the finished block (cache='dual': the reference's sub-block cache)",
             frozenset({"threshold", "sub_block_length", "cache"}), requires_block_causal=True, grid="position",
             shifted_logits=True, joins_rows=True, exact_replay=True, check=_fast_dllm_v2_cache),
    Strategy("lopa", decode_lopa,
             "LoPA: lopa_branches lookahead branches (+ the anchor) verified in one forward per round, on top "
             "of d2f (block-causal models) or threshold (bidirectional)",
             _D2F | _LLADA | {"threshold", "steps", "lopa_branches", "lopa_alpha", "lopa_rho", "lopa_confidence",
                              "lopa_force_anchor"}, branches=True, check=_lopa_refresh, joins_rows=_lopa_joins),
]

for _strategy in BUILTIN:
    register_strategy(_strategy, replace=True)
