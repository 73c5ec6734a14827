"""How a canvas of masks becomes text: strategies, policies, cache plans, loops, batches, stopping and streaming."""

from . import strategies  # registers the built-in strategies before anything asks for one
from .decode_session import DecodeSession
from .engine import generate
from .registry import STRATEGIES, Strategy, StrategyError, get_strategy, register_strategy, strategy_names
from .state import DiffusionGenerateOutput

__all__ = ["STRATEGIES", "DecodeSession", "DiffusionGenerateOutput", "Strategy", "StrategyError", "generate",
           "get_strategy", "register_strategy", "strategies", "strategy_names"]
