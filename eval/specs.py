"""Comma lists of names with ``key=value`` parameters, as ``dllm bench`` takes strategies and suites.

``"vanilla,threshold:cache=dual,threshold=0.9,d2f"`` is three entries: a ``key=value`` item belongs
to the name before it, until the next bare name; ``name:key=value`` opens a name with its first
parameter, so one name's parameters can follow each other with commas. ``;`` separates like a comma
(handy inside one entry: ``threshold:cache=dual;refresh_interval=4``). Values stay strings here;
each caller parses them for what it builds.
"""
from __future__ import annotations


class SpecError(ValueError):
    """A malformed name list (an option before any name, ``a=1:b=2``, nothing at all)."""


def parse_named_specs(spec: str, example: str) -> list[tuple[str, dict[str, str]]]:
    """``spec`` as ``[(name, {key: raw value})]`` in order; SpecError citing ``example`` (a well-formed
    spec of the caller's kind) when it is malformed. A name that looks like a path (holds ``/`` or
    ``.``) is never split at a colon."""
    entries: list[tuple[str, dict[str, str]]] = []
    for item in (s.strip() for s in spec.replace(";", ",").split(",")):
        if not item:
            continue
        name, colon, rest = item.partition(":")
        if colon and "=" not in name and "/" not in name and "." not in name:
            if not name.strip():
                raise SpecError(f"{item!r} in {spec!r} has no name before its colon; as in {example}")
            entries.append((name.strip(), {}))
            item = rest.strip()
            if not item:  # "name:" is the name with no parameters
                continue
        if "=" not in item:
            entries.append((item, {}))
            continue
        key, _, value = item.partition("=")
        if not entries:
            raise SpecError(f"parameter {item!r} comes before any name in {spec!r}; as in {example}")
        if ":" in value or "=" in value:  # "name:a=1:b=2" would silently make a="1:b=2"
            raise SpecError(f"{item!r} in {spec!r}: separate parameters with commas, as in {example}")
        if not key.strip():
            raise SpecError(f"{item!r} in {spec!r} has no parameter name; as in {example}")
        entries[-1][1][key.strip()] = value.strip()
    return entries
