"""uvicorn's HTTP protocol with its own error answers in the OpenAI shape.

A request uvicorn cannot parse (malformed request line or headers, an invalid Content-Length) never
reaches the app: uvicorn answers it with a plain-text 400 itself. This subclass of uvicorn's default
protocol writes the same status as the JSON error every other response uses.
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.auto import AutoHTTPProtocol


class OpenAIErrorProtocol(AutoHTTPProtocol):
    def send_400_response(self, msg: str) -> None:  # noqa: D401 - uvicorn's hook
        body = json.dumps({"error": {"message": f"malformed HTTP request: {msg}", "type": "invalid_request_error",
                                     "param": None, "code": "bad_http_request"}}).encode()
        head = [b"HTTP/1.1 400 Bad Request"]
        head += [name + b": " + value for name, value in self.server_state.default_headers]
        head += [b"content-type: application/json", b"content-length: " + str(len(body)).encode(),
                 b"x-should-retry: false", b"connection: close"]
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.transport.close()
