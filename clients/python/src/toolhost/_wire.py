"""The wire, as docs/CONTRACTS.md of the daemon describes it: request envelopes written as
`id` + `payload` stream entries, and the answers and progress entries read back."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ._content import Block
from ._errors import ClientError

SPEC_VERSION = "1.0"
# A tool name the host accepts (1-64 of [a-zA-Z0-9_-]).
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# The answer type of a cancel, unless the cancel names a response_event.
CANCEL_ANSWER = "tool.cancel.completed"
# The answer type of a tool.input, unless it names a response_event.
INPUT_ANSWER = "tool.input.completed"
# The fields of the envelope a caller may set to tag a call.
TAGS = ("tenant_id", "user_id", "session_id", "trace_id", "traceparent", "tracestate")


# The characters shard tags are made of, in the order they are tried.
_TAG_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
# The slots of a Redis Cluster; the most shards a requests stream may have.
_SLOTS = 16384
MAX_SHARDS = 1024


def crc16(data: bytes) -> int:
    """CRC16/XMODEM, as Redis Cluster hashes keys (and as the shard rule hashes request ids)."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


def _tag_candidate(n: int) -> str:
    """The n-th tag tried: its characters are n in bijective base 62, least significant first."""
    out = []
    while True:
        out.append(_TAG_ALPHABET[n % 62])
        n //= 62
        if n == 0:
            return "".join(out)
        n -= 1


def shard_tag(k: int, count: int) -> str:
    """The hash tag of shard `k` of `count`: the first candidate whose slot lies in the middle
    half of the k-th of `count` equal slices of the cluster's slots (docs/CONTRACTS.md,
    "Sharded requests streams")."""
    lo, hi = k * _SLOTS // count, (k + 1) * _SLOTS // count
    quarter = (hi - lo) // 4
    n = 0
    while True:
        candidate = _tag_candidate(n)
        if lo + quarter <= crc16(candidate.encode()) % _SLOTS < hi - quarter:
            return candidate
        n += 1


def shard_stream(requests: str, count: int, event_type: str, request_id: str | None) -> str:
    """The bare name of the shard of the requests stream `requests` (split into `count`) a
    request goes to: the shard of its request id (a cancel's names the call it cancels), shard 0
    for `tools.*` and for a request without an id."""
    if count <= 1:
        return requests
    k = 0 if event_type.startswith("tools.") or request_id is None else crc16(request_id.encode()) % count
    return f"{requests}:{{{shard_tag(k, count)}}}"


def now_rfc3339() -> str:
    """The current time in RFC 3339 UTC with microseconds."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_id() -> str:
    return str(uuid.uuid4())


def check_tool_name(tool: object) -> str:
    if not isinstance(tool, str) or not TOOL_NAME.fullmatch(tool):
        raise ClientError(f"not a tool name: {tool!r} (tool names are 1-64 of [a-zA-Z0-9_-])")
    return tool


def check_request_id(request_id: object) -> str:
    if not isinstance(request_id, str) or not request_id.strip():
        raise ClientError(f"a request id must be a non-empty string, not {request_id!r}")
    return request_id


def to_json(value: Any, what: str) -> str:
    """Compact JSON of `value`, or a ClientError naming what cannot be sent."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ClientError(f"{what} cannot be sent as JSON: {err}") from err


def timeout_ms(timeout: float | None) -> int | None:
    if timeout is None:
        return None
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not math.isfinite(timeout) or timeout <= 0:
        raise ClientError(f"timeout must be a positive number of seconds, not {timeout!r}")
    return max(1, round(timeout * 1000))


def request_entry(
    event_type: str,
    data: dict[str, Any],
    *,
    source: str,
    topic: str,
    response_topic: str,
    correlation_id: str | None,
    tags: dict[str, str],
) -> tuple[str, str]:
    """The `id` and `payload` fields of a request entry."""
    message_id = new_id()
    envelope: dict[str, Any] = {
        "id": message_id,
        "source": source,
        "specversion": SPEC_VERSION,
        "type": event_type,
        "topic": topic,
        "time": now_rfc3339(),
        "data": data,
        "response_topic": response_topic,
    }
    if correlation_id is not None:
        envelope["correlation_id"] = correlation_id
    for name in TAGS:
        if tags.get(name) is not None:
            envelope[name] = tags[name]
    return message_id, to_json(envelope, "the arguments")


def sign(key_id: str, secret: bytes, payload: str) -> str:
    """The `sig` field of a request entry: `v1=<key id>:<hex HMAC-SHA256(secret, payload)>`, over
    the exact bytes written as `payload`."""
    mac = hmac.new(secret, payload.encode(), hashlib.sha256).hexdigest()
    return f"v1={key_id}:{mac}"


@dataclass(frozen=True)
class Progress:
    """A progress entry of a running call: never final, and ignoring it loses nothing."""

    request_id: str
    progress: float
    total: float | None = None
    message: str | None = None


@dataclass(frozen=True)
class LogEntry:
    """A log message of a running call (a hosted MCP server's `notifications/message`): never
    final, and ignoring it loses nothing."""

    request_id: str
    level: str
    data: Any
    logger: str | None = None


@dataclass(frozen=True)
class InputRequest:
    """A question of a running call (a hosted MCP server's `elicitation/create` or
    `sampling/createMessage`), to answer with an MCP `ElicitResult` or `CreateMessageResult`
    before `expires_at_ms`; nobody answering is a decline."""

    request_id: str
    input_id: str
    kind: str  # "elicitation" or "sampling"
    method: str
    params: dict[str, Any]
    expires_at_ms: int | None = None

    @property
    def message(self) -> str | None:
        """An elicitation's message to the user."""
        message = self.params.get("message")
        return message if isinstance(message, str) else None

    @property
    def requested_schema(self) -> dict[str, Any] | None:
        """An elicitation's form: the JSON Schema the accepted content must fit."""
        schema = self.params.get("requestedSchema")
        return schema if isinstance(schema, dict) else None


def input_of(answer: Answer) -> InputRequest | None:
    """The question an `.input_required` entry holds, or None for one that is malformed."""
    data = answer.data
    request = data.get("request")
    kind = data.get("kind")
    if not isinstance(request, dict) or kind not in ("elicitation", "sampling"):
        return None
    params = request.get("params")
    expires = data.get("expires_at_ms")
    return InputRequest(
        request_id=answer.request_id,
        input_id=str(data["input_id"]),
        kind=str(kind),
        method=str(request.get("method", "")),
        params=params if isinstance(params, dict) else {},
        expires_at_ms=expires if isinstance(expires, int) else None,
    )


def declined(kind: str) -> dict[str, Any]:
    """The response that declines a question: `action: decline`, or a refused sampling."""
    if kind == "sampling":
        return {"error": {"code": -1, "message": "the caller declined to sample"}}
    return {"action": "decline"}


@dataclass(frozen=True)
class Finished:
    """The end of a streamed call: its result and content blocks (errors are raised instead)."""

    request_id: str
    result: Any
    content: tuple[Block, ...] = ()


@dataclass(frozen=True)
class Answer:
    """One entry read from the private stream, sorted out."""

    kind: str  # "answer", "progress", "log", "cancel", "input", "input_answer"
    request_id: str
    data: dict[str, Any]


def parse_entry(fields: dict[bytes, bytes]) -> Answer | None:
    """What an entry of the private stream is, or None for one that is not for a call (the
    stream's opening entry, or anything unreadable)."""
    raw = fields.get(b"payload")
    if raw is None:
        return None
    try:
        payload = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    data = payload.get("data")
    event_type = payload.get("type")
    if not isinstance(data, dict) or not isinstance(event_type, str):
        return None
    request_id = data.get("request_id")
    if not isinstance(request_id, str):
        return None
    if "success" not in data:
        if event_type.endswith(".progress") and isinstance(data.get("progress"), (int, float)):
            return Answer("progress", request_id, data)
        if event_type.endswith(".log") and isinstance(data.get("level"), str):
            return Answer("log", request_id, data)
        if event_type.endswith(".input_required") and isinstance(data.get("input_id"), str):
            return Answer("input", request_id, data)
        return None
    if event_type == CANCEL_ANSWER:
        return Answer("cancel", request_id, data)
    if event_type == INPUT_ANSWER:
        return Answer("input_answer", request_id, data)
    return Answer("answer", request_id, data)


def progress_of(answer: Answer) -> Progress:
    data = answer.data
    total = data.get("total")
    message = data.get("message")
    return Progress(
        request_id=answer.request_id,
        progress=float(data["progress"]),
        total=float(total) if isinstance(total, (int, float)) else None,
        message=message if isinstance(message, str) else None,
    )


def log_of(answer: Answer) -> LogEntry:
    data = answer.data
    logger = data.get("logger")
    return LogEntry(
        request_id=answer.request_id,
        level=str(data["level"]),
        data=data.get("data"),
        logger=logger if isinstance(logger, str) else None,
    )
