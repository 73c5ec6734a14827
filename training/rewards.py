"""What a GRPO rollout scores: the task suites' verifiers, exact match against the reference answer of a
data-file or ``train_dataset`` example, or your own reward functions.

A reward function follows trl's convention: ``fn(prompts, completions, **kwargs) -> list[float]``, one
value per completion. ``prompts`` holds each example's prompt (a string, or the list of chat messages
when the example has more than one prompt turn), ``completions`` the decoded texts up to the first EOS.
Keyword arguments: ``answer`` (the example's reference answer, None when it has none), ``source`` (the
suite name, data-file label or ``train_dataset``) and every other key of the example's row (a
``solution`` column arrives as ``solution=[...]``, None where a row lacks it). A function without
``**kwargs`` gets only the keywords it names. ``None`` in the returned list counts as 0.

With reward functions the task reward of a rollout is their weighted sum (it replaces the verifier
and the exact match), and a rollout counts as correct (for the filter, the NLL term and the
``accuracy`` metric) when that sum is at least ``reward.correct_threshold``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from dllm.eval.tasks.jsonl import exact_match

from .config import ConfigError

RewardFunc = Callable[..., Sequence[float]]


def load_reward_function(path: str) -> RewardFunc:
    """``module:function`` (importable, or found from the working directory) or ``file.py:function``;
    ConfigError naming ``path`` and what is wrong otherwise."""
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise ConfigError(f"reward.functions entry {path!r} must be 'module:function' (e.g. my_rewards:length_penalty) "
                          "or 'path/to/file.py:function'")
    module_name, attr = path.split(":")
    try:
        if module_name.endswith(".py"):
            file = Path(module_name)
            if not file.is_file():
                raise ConfigError(f"reward function {path!r}: file {file} does not exist")
            spec = importlib.util.spec_from_file_location(f"dllm_reward_{file.stem}", file)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            # `dllm train` is a console script, whose sys.path lacks the working directory that
            # `python -m` would have put first: look there too, as a user running from their project expects
            added = "" not in sys.path and str(Path.cwd()) not in sys.path
            if added:
                sys.path.insert(0, str(Path.cwd()))
            try:
                module = importlib.import_module(module_name)
            finally:
                if added:
                    sys.path.remove(str(Path.cwd()))
    except ConfigError:
        raise
    except ImportError as err:
        raise ConfigError(f"reward function {path!r}: cannot import {module_name!r} ({err})") from None
    except Exception as err:  # the module itself failed while importing: say where, keep it one line
        raise ConfigError(f"reward function {path!r}: importing {module_name!r} raised "
                          f"{type(err).__name__}: {err}") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise ConfigError(f"reward function {path!r}: module {module_name!r} has no {attr!r}")
    if not callable(fn):
        raise ConfigError(f"reward function {path!r}: {attr!r} is a {type(fn).__name__}, not a function")
    check_signature(fn, path)
    return fn


def check_signature(fn, name: str) -> None:
    """ConfigError unless ``fn`` can be called as ``fn(prompts, completions)``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: it will tell when called
        return
    try:  # further required parameters are fine: they are filled by name (answer=, a dataset column)
        sig.bind_partial([], [])
    except TypeError:
        raise ConfigError(f"reward function {name!r} must take (prompts, completions, **kwargs); "
                          f"its signature is {sig}") from None


def function_name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _keywords(fn) -> set[str] | None:
    """The keyword arguments ``fn`` accepts (None: any, it has ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)}


class Scorer:
    """Scores rollouts: ``scorer(examples, texts) -> (correct, reward)``, one per rollout.

    Without functions: a suite example by its suite's verifier (strict ``correct``, graded ``reward``),
    any other example by exact match with its reference (whitespace runs count as one space). With
    functions: the weighted sum of their values, correct at ``correct_threshold`` or more. ``means()``
    gives each function's mean value over the rollouts scored since the last call (the step's metrics).
    """

    def __init__(self, functions: Sequence[RewardFunc] = (), weights: Sequence[float] = (),
                 correct_threshold: float = 0.5) -> None:
        self.functions = list(functions)
        self.weights = [float(w) for w in weights] or [1.0] * len(self.functions)
        if len(self.weights) != len(self.functions):
            raise ConfigError(f"reward.function_weights has {len(self.weights)} weights for {len(self.functions)} "
                              "reward functions; give one per function (or none: 1.0 each)")
        self.correct_threshold = float(correct_threshold)
        names, self.names = [function_name(f) for f in self.functions], []
        for n in names:  # unique metric columns: reward_<name>, reward_<name>_2, ...
            label, i = n, 2
            while label in self.names:
                label, i = f"{n}_{i}", i + 1
            self.names.append(label)
        self._sums = {n: [0.0, 0] for n in self.names}

    @property
    def zero_truncated(self) -> bool:
        """A completion without EOS scores 0 under the verifier and exact match; a function sees the text
        itself and decides (reward.truncated_is_wrong still clears its ``correct``)."""
        return not self.functions

    def __call__(self, examples: list, texts: list[str]) -> tuple[list[bool], list[float]]:
        if not self.functions:
            return self._builtin(examples, texts)
        total = [0.0] * len(texts)
        prompts = [_prompt(ex) for ex in examples]
        columns = {"answer": [ex.answer for ex in examples], "source": [ex.suite for ex in examples]}
        extra_keys = dict.fromkeys(k for ex in examples for k in ex.meta.get("extra", {}))
        for k in extra_keys:
            if k not in columns:
                columns[k] = [ex.meta.get("extra", {}).get(k) for ex in examples]
        for fn, w, name in zip(self.functions, self.weights, self.names):
            accepts = _keywords(fn)
            kwargs = columns if accepts is None else {k: v for k, v in columns.items() if k in accepts}
            values = fn(prompts, list(texts), **kwargs)
            values = self._check(values, len(texts), name)
            s = self._sums[name]
            s[0] += sum(values)
            s[1] += len(values)
            total = [t + w * v for t, v in zip(total, values)]
        return [t >= self.correct_threshold for t in total], total

    @staticmethod
    def _check(values, n: int, name: str) -> list[float]:
        try:
            values = list(values)
        except TypeError:
            raise ConfigError(f"reward function {name!r} returned {type(values).__name__}; it must return a "
                              f"list of {n} numbers, one per completion") from None
        if len(values) != n:
            raise ConfigError(f"reward function {name!r} returned {len(values)} values for {n} completions")
        out = []
        for v in values:
            try:
                x = 0.0 if v is None else float(v)
            except (TypeError, ValueError):
                raise ConfigError(f"reward function {name!r} returned {v!r}; rewards must be numbers (or None)") from None
            if not math.isfinite(x):
                raise ConfigError(f"reward function {name!r} returned {x}; rewards must be finite")
            out.append(x)
        return out

    @staticmethod
    def _builtin(examples: list, texts: list[str]) -> tuple[list[bool], list[float]]:
        from dllm.eval.tasks import get_suite

        correct, reward = [], []
        for ex, text in zip(examples, texts):
            if "messages" in ex.meta:  # a data-file / train_dataset example
                ok = exact_match(text, ex.answer)
                correct.append(ok)
                reward.append(float(ok))
            else:
                s = get_suite(ex.suite).score(ex, text)
                correct.append(bool(s.correct))
                reward.append(float(s.reward))
        return correct, reward

    def means(self) -> dict[str, float]:
        out = {f"reward_{n}": s[0] / s[1] for n, s in self._sums.items() if s[1]}
        self._sums = {n: [0.0, 0] for n in self.names}
        return out


def _prompt(ex):
    msgs = ex.meta.get("messages")
    if msgs is None or (len(msgs) == 1 and msgs[0]["role"] == "user"):
        return ex.prompt
    return [dict(m) for m in msgs]
