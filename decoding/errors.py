"""Errors in decoding settings: the message names the field or strategy, the value and what is allowed."""


class GenerationConfigError(ValueError):
    """An invalid decoding setting; the message names the field, the value and what is allowed."""


class StrategyError(ValueError):
    """Unknown strategy, or a strategy that cannot run on this model."""
