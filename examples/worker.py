"""An example agent worker: calls toolhost's `echo` tool over Redis Streams and prints the answer.

docker-compose.yml runs it once toolhost is ready. Outside compose:

    pip install redis
    REDIS_URL=redis://127.0.0.1:6379 python examples/worker.py

It does what any agent does: add one request to `action-requests`, then read `action-results`
until the answer carrying its `request_id` arrives.
"""

import json
import os
import sys
import time
import uuid
from datetime import datetime, timezone

import redis

REQUESTS = os.environ.get("TOOLHOST_REQUESTS_STREAM", "action-requests")
RESULTS = os.environ.get("TOOLHOST_RESULTS_STREAM", "action-results")
TIMEOUT_S = 30.0


def request(request_id: str, message_id: str) -> dict:
    """A `tool.invoke` envelope for `echo`."""
    return {
        "id": message_id,
        "source": "agent:compose-example",
        "specversion": "1.0",
        "type": "tool.invoke",
        "time": datetime.now(timezone.utc).isoformat(),
        "correlation_id": request_id,
        "data": {
            "request_id": request_id,
            "tool": "echo",
            "arguments": {"message": "hello from the example worker"},
        },
    }


def main() -> int:
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"), decode_responses=True)
    request_id = str(uuid.uuid4())
    message_id = str(uuid.uuid4())
    # Start reading results at the current end, so only newer answers are scanned.
    newest = client.xrevrange(RESULTS, count=1)
    cursor = newest[0][0] if newest else "0-0"
    client.xadd(REQUESTS, {"id": message_id, "payload": json.dumps(request(request_id, message_id))})
    print(f"sent request {request_id} to {REQUESTS}", flush=True)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        for _stream, entries in client.xread({RESULTS: cursor}, count=100, block=1000) or []:
            for entry_id, fields in entries:
                cursor = entry_id
                answer = json.loads(fields.get("payload", "{}"))
                data = answer.get("data", {})
                if data.get("request_id") == request_id:
                    print(json.dumps(answer, indent=2), flush=True)
                    return 0 if data.get("success") else 1
    print(f"no answer within {TIMEOUT_S:.0f} s: is toolhost serving this Redis?", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
