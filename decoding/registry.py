"""The strategy registry: each decoding strategy is a :class:`Strategy` record holding its loop, its commit
policy and what it can do. Code that depends on a strategy asks the record (``strategy.joins_rows``,
``strategy.branches``, ...), never its name.

The built-in strategies are registered by :mod:`dllm.decoding.strategies` when ``dllm.decoding`` is imported;
:func:`register_strategy` adds one from outside the package (a loop and policy of your own, or a new policy
on a built-in loop)::

    from dllm.decoding.registry import Strategy, register_strategy
    from dllm.decoding.loops.semi_ar import decode_semi_ar

    register_strategy(Strategy("top2", decode_semi_ar, "two tokens per step", policy=TopTwo, joins_rows=True))
    model.generate(ids, strategy="top2")
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

from .errors import StrategyError

# Options every strategy reads: the canvas, sampling, stopping and ids.
COMMON_OPTIONS = frozenset({
    "strategy", "max_new_tokens", "block_length", "temperature", "top_p", "top_k", "min_p", "suppress_mask_token",
    "stop_at_eos", "min_tokens", "ignore_eos", "stop_strings", "seed", "max_steps", "mask_token_id", "eos_token_id",
    "pad_token_id", "return_dict_in_generate",
})


@dataclass(frozen=True)
class Strategy:
    """A decoding strategy: what runs and what it can do.

    ``loop`` is a generator function ``loop(model, state, generator, **resources)`` that yields once
    after every forward (a :class:`~dllm.decoding.decode_session.DecodeSession` step) and returns its stats
    dict; ``policy`` is the commit policy class a shared loop builds once per call (the semi-AR loop's
    quota, threshold, factor and Dream rules: :mod:`dllm.decoding.commit`).
    """

    name: str
    loop: Callable
    summary: str
    options: frozenset[str] = frozenset()  # the options it reads besides COMMON_OPTIONS
    policy: type | None = None
    # -- capabilities ------------------------------------------------------------------------------
    requires_block_causal: bool = False
    # "prompt": blocks from the prompt end (any model); "position": the model's own blocks from
    # position 0 (position-aligned block-causal models: SDAR, Fast-dLLM v2, LLaDA2)
    grid: str = "prompt"
    shifted_logits: bool = False  # needs a model whose token i is read at position i - 1 (Fast-dLLM v2)
    # rows may be added to a running batch (continuous batching): a bool, or ``joins_rows(cfg)`` where it
    # depends on the settings (read through :meth:`can_join`)
    joins_rows: bool | Callable = False
    exact_replay: bool = False  # GRPO's trajectory estimator can replay its decoding steps exactly
    branches: bool = False  # evaluates lookahead branches (LoPA): a row costs lopa_branches + 1 canvas rows
    guidance: bool = False  # classifier-free guidance (cfg_scale > 0, without a cache)
    threshold_option: str | None = "threshold"  # its probability threshold, if it has one (GRPO's rollout.threshold)
    row_options: frozenset[str] = frozenset()  # options that may differ between the rows of one batch
    # Settings under which its rows decode exactly as rows of another strategy's batch, so the two share
    # forwards (a server's mixed load): ``batches_as(model, cfg)`` returns (that strategy's name, the
    # options that make it decode like ``cfg``) or None. See :mod:`dllm.decoding.batching`.
    batches_as: Callable | None = None
    # Strategy-specific checks: ``validate(cfg)`` returns a problem with the config alone (checked when
    # a DiffusionGenerationConfig is built), ``check(model, cfg)`` raises before any forward.
    validate: Callable | None = None
    check: Callable | None = None
    extra_forwards: Callable | None = None  # forwards beyond one per token a row may need (step_limit)

    def reads(self, option: str) -> bool:
        """Whether this strategy's decoding depends on ``option`` (a sweep over one it ignores is moot)."""
        return option in COMMON_OPTIONS or option in self.options

    def unread(self, names) -> list[str]:
        """Of ``names`` (options a caller set), the ones this strategy's decoding does not depend on.
        ``steps`` is never one: every strategy's default step limit grows with it, and the Fast-dLLM
        references take it with a threshold (``dual_cache_step_bound``)."""
        return [n for n in names if n != "steps" and not self.reads(n)]

    def can_join(self, cfg) -> bool:
        """Whether rows may be added to a running batch decoding with ``cfg``."""
        if cfg.cfg_scale:  # classifier-free guidance doubles the batch inside a forward: rows start together
            return False
        return bool(self.joins_rows(cfg) if callable(self.joins_rows) else self.joins_rows)

    def canvas_rows(self, cfg) -> int:
        """Canvas rows one answer occupies (LoPA: the anchor and its lookahead branches)."""
        return cfg.lopa_branches + 1 if self.branches else 1


STRATEGIES: dict[str, Strategy] = {}


def register_strategy(strategy: Strategy, *, replace: bool = False) -> Strategy:
    """Add ``strategy`` to the registry (``replace=True`` to redefine a name)."""
    if not isinstance(strategy, Strategy):
        raise TypeError(f"register_strategy takes a Strategy, got {type(strategy).__name__}")
    if strategy.name in STRATEGIES and not replace:
        raise StrategyError(f"strategy {strategy.name!r} is already registered; pass replace=True to redefine it")
    if strategy.grid not in ("prompt", "position"):
        raise StrategyError(f"strategy {strategy.name!r}: grid must be 'prompt' or 'position', got {strategy.grid!r}")
    if not callable(strategy.loop):
        raise StrategyError(f"strategy {strategy.name!r}: loop must be a callable")
    STRATEGIES[strategy.name] = strategy
    return strategy


def unregister_strategy(name: str) -> None:
    STRATEGIES.pop(name, None)


def strategy_names() -> list[str]:
    return list(STRATEGIES)


def unread_options_error(strategy: str, names) -> str | None:
    """Why options a caller set (``names``) would do nothing under ``strategy``, naming each one's readers,
    or None. ``model.generate`` warns with it, the CLI and the server refuse with it: a config object may
    carry every strategy's fields (a sweep keeps one), but an option set for one call is meant to act."""
    unread = get_strategy(strategy).unread(names)
    if not unread:
        return None
    said = "; ".join(f"{n} (read by {', '.join(s.name for s in STRATEGIES.values() if s.reads(n)) or 'none'})"
                     for n in unread)
    return f"strategy {strategy!r} does not read {said}"


def warn_unread_options(strategy: str, names, stacklevel: int = 3) -> None:
    """A UserWarning (as transformers warns of generation flags a mode ignores) if ``names`` holds options
    ``strategy`` does not read."""
    if (said := unread_options_error(strategy, names)) is not None:
        warnings.warn(f"{said}; setting it changes nothing", UserWarning, stacklevel=stacklevel)


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise StrategyError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def _spec(model):
    """The model's CoreSpec (a loaded model's, or its config's: the server checks requests without the weights)."""
    spec = getattr(model, "spec", None)
    if spec is None and hasattr(getattr(model, "config", None), "core_spec"):
        spec = model.config.core_spec()
    return spec


def check_compatible(strategy: Strategy, model, cfg=None) -> None:
    """Fail before any forward if the strategy cannot run on this model with these settings."""
    if strategy.requires_block_causal and not model.is_block_causal:
        raise StrategyError(
            f"strategy {strategy.name!r} needs a block-causal model (config attention_policy='block_causal', "
            "e.g. --model tiny-d2f); this model is bidirectional. Use 'threshold' with cache='dual', or load "
            "the checkpoint with attention_policy='block_causal' and block_size=N"
        )
    spec = _spec(model)
    if strategy.grid == "position" and getattr(spec, "block_alignment", "prompt") != "position":
        raise StrategyError(
            f"strategy {strategy.name!r} decodes the blocks a checkpoint was trained on, counted from position 0 "
            "(SDAR, TraDo, LightningRL, Fast-dLLM v2); this model's blocks start at the prompt end (a D2F "
            "student). Use 'd2f' or 'threshold'"
        )
    if strategy.shifted_logits and not getattr(spec, "logit_shift", False):
        raise StrategyError(
            f"strategy {strategy.name!r} reads the next block's first token from the last position of the "
            "finished block, which needs a model with shifted logits (Fast-dLLM v2); this model's logits are "
            "aligned. Use 'sdar' or 'threshold'"
        )
    if cfg is not None and strategy.check is not None:
        strategy.check(model, cfg)
