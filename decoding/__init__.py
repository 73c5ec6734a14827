"""How a canvas of masks becomes text: policies, loops, caches, stopping and streaming."""

from .engine import generate
from .registry import STRATEGIES, StrategyError, get_strategy, strategy_names
from .state import DiffusionGenerateOutput

__all__ = ["STRATEGIES", "DiffusionGenerateOutput", "StrategyError", "generate", "get_strategy", "strategy_names"]
