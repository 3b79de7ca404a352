"""The one error type of the gateway: an HTTP status plus an OpenAI-style error body.

Every problem a caller can cause (malformed JSON, a bad field, an unknown
rollout, a context that does not fit) is raised as :class:`GatewayError` by the
code that finds it, with the JSON path of the offending field as ``param``. The
HTTP layer turns it into ``{"error": {"message", "type", "param", "code"}}``,
the shape the official OpenAI clients parse into their exceptions.
"""

from __future__ import annotations

from typing import Any

ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}
"""OpenAI-style error ``type`` for each status the gateway returns."""


class GatewayError(Exception):
    """A request the gateway refuses; ``status`` is the HTTP status to answer with."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The OpenAI-style JSON error body."""
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}`` for an HTTP status."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    """A 400 error (shorthand used by the request validators)."""
    return GatewayError(400, message, param=param, code=code)
