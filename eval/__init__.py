"""dllm evaluation: task suites (generators + scorers shared with training rewards) and metrics."""
from .metrics import accuracy, aup, count_generated_tokens, latency_percentiles, tpf
from .tasks import Example, Score, TaskSuite, count_tokens, get_suite, resolve_suites, suite_names

__all__ = [
    "Example", "Score", "TaskSuite", "accuracy", "aup", "count_generated_tokens", "count_tokens",
    "get_suite", "latency_percentiles", "resolve_suites", "suite_names", "tpf",
]
