"""The errors a call can end with: one ToolError subclass per error code the host answers,
NoAnswer when nothing answers in time, and ClientError for what the client refuses itself."""

from __future__ import annotations

from typing import Any

# Codes whose answer is final for the request id: the tool ran, or may have (README, "Errors").
FINAL_CODES = frozenset({"tool_failed", "timeout", "invalid_output", "cancelled", "interrupted"})


class ClientError(Exception):
    """The client refused a call before sending anything (bad input, a closed client)."""


class ClientClosed(ClientError):
    """The client is closed; open a new one."""


class ConnectionFailed(ClientError, ConnectionError):
    """Redis could not be reached or refused the login."""


class RequestNotReplicated(Exception):
    """The request was written to the Redis master, but fewer replicas than `replica_acks`
    acknowledged it in time: a failover now could lose it. It may still be answered, or it may
    vanish with the master; sending it again with the same request id is safe either way (the
    host runs a request id at most once), and `retries` does so."""

    def __init__(self, request_id: str, acked: int, wanted: int, waited: float) -> None:
        self.request_id = request_id
        self.acked = acked
        self.wanted = wanted
        self.waited = waited
        super().__init__(
            f"request {request_id} was written, but {acked} of the {wanted} replicas asked for "
            f"acknowledged it within {waited:g} s: a failover now could lose it; send it again "
            "with the same request_id if no answer comes"
        )


class NoAnswer(TimeoutError):
    """Nothing answered the call in time. The request may still run; its id says which."""

    def __init__(self, request_id: str, waited: float, tool: str) -> None:
        self.request_id = request_id
        self.waited = waited
        self.tool = tool
        super().__init__(
            f"no answer to the call of '{tool}' (request id {request_id}) within {waited:g} s; "
            "is a toolbox hosting it running?"
        )


class ToolError(Exception):
    """An error answer from the host.

    `code` is the wire's `error_code`, `details` its `details` (or None), `request_id` the
    call's id, and `final` whether the id is done: a final error (the tool ran, or may have)
    is not retried with the same id, a non-final one may be.
    """

    code: str = "internal"

    def __init__(self, message: str, *, request_id: str, details: Any = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        self.details = details
        if code is not None:
            self.code = code

    @property
    def final(self) -> bool:
        return self.code in FINAL_CODES

    def __str__(self) -> str:
        lines = [f"{self.code}: {self.message}"]
        errors = self.details.get("errors") if isinstance(self.details, dict) else None
        if isinstance(errors, list):
            for error in errors:
                if isinstance(error, dict):
                    pointer = error.get("pointer") or "/"
                    lines.append(f"- at {pointer} (rule {error.get('rule')}): {error.get('message')}")
        lines.append(f"(request id {self.request_id})")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, request_id={self.request_id!r}, details={self.details!r})"


class InvalidRequest(ToolError):
    code = "invalid_request"


class InvalidArguments(ToolError):
    code = "invalid_arguments"


class UnknownTool(ToolError):
    code = "unknown_tool"


class ToolDisabled(ToolError):
    code = "tool_disabled"


class Forbidden(ToolError):
    code = "forbidden"


class Overloaded(ToolError):
    code = "overloaded"

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait before a retry, when the host said."""
        if isinstance(self.details, dict) and isinstance(self.details.get("retry_after_ms"), (int, float)):
            return float(self.details["retry_after_ms"]) / 1000.0
        return None


class Expired(ToolError):
    code = "expired"


class ToolTimeout(ToolError):
    code = "timeout"


class ToolFailed(ToolError):
    code = "tool_failed"


class InvalidOutput(ToolError):
    code = "invalid_output"


class Cancelled(ToolError):
    code = "cancelled"


class Interrupted(ToolError):
    code = "interrupted"


class Internal(ToolError):
    code = "internal"


BY_CODE: dict[str, type[ToolError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        InvalidArguments,
        UnknownTool,
        ToolDisabled,
        Forbidden,
        Overloaded,
        Expired,
        ToolTimeout,
        ToolFailed,
        InvalidOutput,
        Cancelled,
        Interrupted,
        Internal,
    )
}


def error_from(data: dict[str, Any], request_id: str) -> ToolError:
    """The ToolError of a failed answer's `data`; an unknown code is a plain ToolError."""
    code = str(data.get("error_code") or "internal")
    message = str(data.get("error") or code)
    cls = BY_CODE.get(code, ToolError)
    return cls(message, request_id=request_id, details=data.get("details"), code=code)
