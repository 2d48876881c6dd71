"""The one error type that crosses from the runtime to the HTTP layer.

`ApiError(status, type, message, retry_after=None, close=False)` is what every refusal becomes: the HTTP layer
answers it as JSON `{"error": {"type", "message"}}` with that status (plus Retry-After when set)
and never has to know which part of the runtime raised it. 4xx: the client's mistake; 5xx: the
model or the node failed; 503 always carries Retry-After.
"""

from __future__ import annotations

import orjson


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        type_: str,
        message: str,
        retry_after: int | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.retry_after = retry_after if retry_after is not None or status != 503 else 1
        self.close = (
            close  # answer with Connection: close (a drain, a connection we will not reuse)
        )


def bad_input(message: str, type_: str = "invalid_input") -> ApiError:
    return ApiError(400, type_, message)


def internal_error(exc: BaseException, close: bool = True) -> ApiError:
    """A bug behind the HTTP layer (not the client's, not the model's): 500 naming the exception."""
    return ApiError(500, "internal_error", f"{type(exc).__name__}: {exc}", close=close)


def error_body(type_: str, message: str) -> bytes:
    """The JSON body of every error answer."""
    return orjson.dumps({"error": {"type": type_, "message": message}})
