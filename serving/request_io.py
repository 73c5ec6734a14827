"""Reading a request: the JSON body (size-capped, strict) and its validation into a protocol model;
every failure is a ServingError in the OpenAI shape that names the field."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from .errors import ServingError, bad_request
from .protocol import DIFFUSION_FIELDS, unknown_fields


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request, limit: int) -> dict:
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise ServingError(413, f"request body is {length} bytes; the limit is {limit}", code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ServingError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise bad_request(f"the request body is not valid JSON ({str(err)[:200]})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    if (where := _lone_surrogate(body)) is not None:
        raise bad_request(f"{where or 'the body'} holds a lone UTF-16 surrogate (an escaped \\ud800-\\udfff "
                          "without its pair), which is not text", param=where.split(".")[0] or None,
                          code="invalid_text")
    return body


def _lone_surrogate(value, path: str = "") -> str | None:
    """The path of the first string with a lone surrogate (JSON allows the escape; text cannot hold it)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and _lone_surrogate(key) is not None:
            return path or "body"
        found = _lone_surrogate(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def parse(model: type[BaseModel], body: dict) -> Any:
    if unknown := unknown_fields(model, body):
        raise bad_request(f"unknown field(s): {'; '.join(unknown)}. Diffusion options: "
                          f"{', '.join(DIFFUSION_FIELDS)}", param=unknown[0].split(" ")[0], code="unknown_parameter")
    try:
        return model.model_validate(body)
    except ValidationError as err:
        errors = err.errors(include_url=False, include_input=False)
        parts = []
        for e in errors[:5]:
            loc = ".".join(str(x) for x in e["loc"]) or "body"
            parts.append(f"{loc}: {e['msg']}")
        first = errors[0]["loc"] if errors else ()
        param = str(first[0]) if first else None
        more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
        raise bad_request("invalid request: " + "; ".join(parts) + more, param=param) from None


