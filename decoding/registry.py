"""The strategy registry: name -> loop, and which models each strategy can run on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .errors import GenerationConfigError, StrategyError

# Options every strategy reads: the canvas, sampling, stopping and ids.
COMMON_OPTIONS = frozenset({
    "strategy", "max_new_tokens", "block_length", "temperature", "top_p", "top_k", "min_p", "suppress_mask_token",
    "stop_at_eos", "min_tokens", "ignore_eos", "stop_strings", "seed", "max_steps", "mask_token_id", "eos_token_id",
    "pad_token_id", "return_dict_in_generate",
})
_CACHED = frozenset({"cache", "refresh_interval", "dual_cache_step_bound"})
_LLADA = frozenset({"remasking"}) | _CACHED
_D2F = frozenset({"block_add_threshold", "decoded_token_threshold", "skip_threshold", "d2f_confidence"})


@dataclass(frozen=True)
class Strategy:
    name: str
    loop: str  # "module:function", imported on use so the registry stays import-light
    requires: str  # "any" | "block_causal"
    summary: str
    options: frozenset[str] = frozenset()  # the options it reads besides COMMON_OPTIONS

    def reads(self, option: str) -> bool:
        """Whether this strategy's decoding depends on ``option`` (a sweep over one it ignores is moot)."""
        return option in COMMON_OPTIONS or option in self.options

    def load(self) -> Callable:
        import importlib

        module, fn = self.loop.split(":")
        return getattr(importlib.import_module(module), fn)


_SEMI_AR = "dllm.decoding.loops.semi_ar:decode_semi_ar"
STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in [
        Strategy("vanilla", _SEMI_AR, "any", "LLaDA semi-AR decoding: a fixed per-block token quota over `steps`",
                 _LLADA | {"steps", "cfg_scale"}),
        Strategy("threshold", _SEMI_AR, "any", "Fast-dLLM: commit every masked token with confidence >= threshold (+ the best)",
                 _LLADA | {"threshold"}),
        Strategy("factor", _SEMI_AR, "any", "Fast-dLLM factor rule: accept the k best while c_k >= 1 - factor/(k+1)",
                 _LLADA | {"factor"}),
        *(Strategy(name, _SEMI_AR, "any", f"Dream: timestep schedule, positions ranked by {rank}",
                   _CACHED | {"steps", "eps", "alg_temp"})
          for name, rank in (("entropy", "negative entropy"), ("margin", "top1 - top2 probability"),
                             ("maskgit_plus", "max probability"))),
        Strategy("d3llm", "dllm.decoding.loops.pipeline:decode_pipeline", "any",
                 "d3LLM: pipelined multi-block decoding, commit tokens with entropy <= entropy_threshold",
                 frozenset({"entropy_threshold", "block_add_threshold", "decoded_token_threshold", "cache",
                            "cache_delay", "refresh_interval"})),
        Strategy("d2f", "dllm.decoding.loops.pipeline:decode_pipeline", "block_causal",
                 "D2F: pipelined multi-block decoding with an exact block KV cache (tau_add/tau_act/tau_conf)", _D2F),
        Strategy("lopa", "dllm.decoding.lopa:decode_lopa", "any",
                 "LoPA: lopa_branches lookahead branches (+ the anchor) verified in one forward per round, on top "
                 "of d2f (block-causal models) or threshold (bidirectional)",
                 _D2F | _LLADA | {"threshold", "steps", "lopa_branches", "lopa_alpha", "lopa_rho", "lopa_confidence",
                                  "lopa_force_anchor"}),
    ]
}


def strategy_names() -> list[str]:
    return list(STRATEGIES)


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise StrategyError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def check_compatible(strategy: Strategy, model, cfg=None) -> None:
    """Fail before any forward if the strategy cannot run on this model with these settings."""
    if strategy.requires == "block_causal" and not model.is_block_causal:
        raise StrategyError(
            f"strategy {strategy.name!r} needs a block-causal model (config attention_policy='block_causal', "
            "e.g. --model tiny-d2f); this model is bidirectional. Use 'threshold' with cache='dual', or load "
            "the checkpoint with attention_policy='block_causal' and block_size=N"
        )
    if cfg is not None and strategy.name == "lopa" and not model.is_block_causal and cfg.refresh_interval:
        raise GenerationConfigError(
            "strategy='lopa' on a bidirectional model does not support refresh_interval: a refresh in the middle of "
            "a block would bake one branch's lookahead token into every slot's cache"
        )
