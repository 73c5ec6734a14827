"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}``.

The ``openai`` client retries 408/409/429 and every status >= 500 unless the response says
``x-should-retry: false``; every error here that would fail the same way again says so.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi.responses import JSONResponse

INVALID = "invalid_request_error"


class ServingError(Exception):
    """An error that becomes an HTTP response (or an ``error`` event inside a stream)."""

    def __init__(self, status: int, message: str, *, type: str = INVALID, param: str | None = None,
                 code: str | None = None, retry: bool = False, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry = retry
        self.headers = dict(headers or {})

    def __reduce__(self):  # picklable: errors cross from the engine process to the API process
        return (_rebuild, (self.status, self.message, self.type, self.param, self.code, self.retry, self.headers))

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = dict(self.headers)
        if not self.retry:
            headers["x-should-retry"] = "false"
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def _rebuild(status, message, type, param, code, retry, headers) -> ServingError:
    return ServingError(status, message, type=type, param=param, code=code, retry=retry, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ServingError:
    return ServingError(400, message, param=param, code=code)


def unsupported(param: str, what: str) -> ServingError:
    return ServingError(400, f"{param}: {what} is not supported by this server", param=param, code="unsupported_parameter")


def queue_full(retry_after_s: int = 1) -> ServingError:
    return ServingError(503, f"the server is at capacity (request queue full); retry in about {retry_after_s} s",
                        type="server_error", code="queue_full", retry=True, headers={"Retry-After": str(retry_after_s)})


class BatchClock:
    """How long a batch takes (a moving average of generate calls), for the ``Retry-After`` of a full queue:
    the queue ahead of a new request drains in about ``queued / rows per batch`` batches."""

    def __init__(self) -> None:
        self.seconds: float | None = None

    def add(self, seconds: float) -> None:
        self.seconds = seconds if self.seconds is None else 0.8 * self.seconds + 0.2 * seconds

    def retry_after(self, queued_rows: int, max_batch_size: int) -> int:
        if self.seconds is None:
            return 1
        return max(1, min(60, math.ceil(queued_rows / max(1, max_batch_size) * self.seconds)))


def shutting_down() -> ServingError:
    return ServingError(503, "the server is shutting down; retry on another replica or shortly", type="server_error",
                        code="shutting_down", retry=True, headers={"Retry-After": "1"})


def not_ready() -> ServingError:
    return ServingError(503, "the model is still loading; retry shortly", type="server_error", code="not_ready",
                        retry=True, headers={"Retry-After": "1"})


def internal(message: str) -> ServingError:
    # A failure inside decoding for a request we accepted: deterministic, so no retry.
    return ServingError(500, message, type="server_error", code="internal_error")
