"""APIError: a request refused, answered in OpenAI's JSON error shape."""
from __future__ import annotations


class APIError(Exception):
    """An error answered to the client in OpenAI's JSON shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate a client sent
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
