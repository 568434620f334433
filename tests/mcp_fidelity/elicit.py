"""A hosted server's questions answered from Python over Redis (`on_input=`), driven by
tests/tests/mcp_fidelity.rs: the reference server's `test_elicitation` and `test_sampling`,
hosted behind a toolbox with no prefix. Prints one JSON object on its last line: what the
client saw and what the tools answered.

    elicit.py <redis url>
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from toolhost import AsyncClient, Client, InputRequest, InvalidArguments


def blocking(url: str) -> dict[str, Any]:
    """A plain function answers, on a worker thread of the blocking client."""
    seen: list[dict[str, Any]] = []

    def answer(question: InputRequest) -> dict[str, Any]:
        seen.append(
            {
                "kind": question.kind,
                "method": question.method,
                "message": question.message,
                "required": (question.requested_schema or {}).get("required"),
                "expires": isinstance(question.expires_at_ms, int),
            }
        )
        return {"action": "accept", "content": {"response": "from python"}}

    with Client(url) as client:
        result = client.call("test_elicitation", {"message": "Name?"}, on_input=answer)
    return {"result": result, "seen": seen}


async def asynchronous(url: str) -> dict[str, Any]:
    """A coroutine answers; before it does, a response that breaks the form is refused and a
    question nobody asked is unknown; after the call, a late answer changes nothing."""
    report: dict[str, Any] = {}
    questions: list[InputRequest] = []
    async with AsyncClient(url) as client:

        async def answer(question: InputRequest) -> dict[str, Any]:
            questions.append(question)
            try:
                bad = {"action": "accept", "content": {"response": 5}}
                report["invalid"] = await client.answer_input(question.request_id, question.input_id, bad)
            except InvalidArguments as err:
                errors = err.details.get("errors", []) if isinstance(err.details, dict) else []
                report["invalid"] = {"code": err.code, "pointers": [error.get("pointer") for error in errors]}
            report["unknown"] = await client.answer_input(question.request_id, "never-asked", {"action": "decline"})
            return {"action": "accept", "content": {"response": "async"}}

        report["result"] = await client.call("test_elicitation", {"message": "Async?"}, on_input=answer)
        first = questions[0]
        late = {"action": "accept", "content": {"response": "late"}}
        report["late"] = await client.answer_input(first.request_id, first.input_id, late)

        async def sample(question: InputRequest) -> dict[str, Any]:
            text = question.params["messages"][0]["content"]["text"]
            return {"role": "assistant", "content": {"type": "text", "text": f"sampled: {text}"}, "model": "py"}

        report["sampling"] = await client.call("test_sampling", {"prompt": "hi"}, on_input=sample)
        report["sampling_declined"] = await client.call("test_sampling", {"prompt": "no"}, on_input=lambda q: None)
        # Nobody answers: the host declines a second before the call's deadline.
        report["unanswered"] = await client.call("test_elicitation", {"message": "Anyone?"}, timeout=3)
        # A callback that gives None declines at once.
        report["declined"] = await client.call("test_elicitation", {"message": "No?"}, on_input=lambda q: None)
    return report


def main() -> int:
    url = sys.argv[1]
    report = {"blocking": blocking(url), "async": asyncio.run(asynchronous(url))}
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
