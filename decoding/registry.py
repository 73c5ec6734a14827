"""The strategy registry: name -> loop, and which models each strategy can run on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .errors import GenerationConfigError, StrategyError


@dataclass(frozen=True)
class Strategy:
    name: str
    loop: str  # "module:function", imported on use so the registry stays import-light
    requires: str  # "any" | "block_causal"
    summary: str

    def load(self) -> Callable:
        import importlib

        module, fn = self.loop.split(":")
        return getattr(importlib.import_module(module), fn)


_SEMI_AR = "dllm.decoding.loops.semi_ar:decode_semi_ar"
STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in [
        Strategy("vanilla", _SEMI_AR, "any", "LLaDA semi-AR decoding: a fixed per-block token quota over `steps`"),
        Strategy("threshold", _SEMI_AR, "any", "Fast-dLLM: commit every masked token with confidence >= threshold (+ the best)"),
        Strategy("factor", _SEMI_AR, "any", "Fast-dLLM factor rule: accept the k best while c_k >= 1 - factor/(k+1)"),
        Strategy("entropy", _SEMI_AR, "any", "Dream: timestep schedule, positions ranked by negative entropy"),
        Strategy("margin", _SEMI_AR, "any", "Dream: timestep schedule, positions ranked by top1 - top2 probability"),
        Strategy("maskgit_plus", _SEMI_AR, "any", "Dream: timestep schedule, positions ranked by max probability"),
        Strategy("d3llm", "dllm.decoding.loops.pipeline:decode_pipeline", "any",
                 "d3LLM: pipelined multi-block decoding, commit tokens with entropy <= entropy_threshold"),
        Strategy("d2f", "dllm.decoding.loops.pipeline:decode_pipeline", "block_causal",
                 "D2F: pipelined multi-block decoding with an exact block KV cache (tau_add/tau_act/tau_conf)"),
        Strategy("lopa", "dllm.decoding.loops.lopa:decode_lopa", "any",
                 "LoPA: lopa_branches lookahead branches (+ the anchor) verified in one forward per round, on top "
                 "of d2f (block-causal models) or threshold (bidirectional)"),
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
