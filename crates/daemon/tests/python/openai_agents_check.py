"""Loads toolhost's OpenAI-format tool list into the openai-agents SDK, the way an agent would.

Reads the JSON list printed by `toolhost tools --format openai` on stdin. For each tool it checks
the OpenAI function-tool shape with the SDK's own pydantic model, builds an agents.FunctionTool
(which runs the SDK's strict-schema conversion when strict is on), and, for strict tools, checks
that the conversion changed nothing: the schema toolhost exports is already strict-ready.
Exits non-zero with a message on the first problem.
"""

import copy
import json
import re
import sys

from agents import FunctionTool
from agents.strict_schema import ensure_strict_json_schema
from openai.types.shared import FunctionDefinition


async def _never_called(_ctx, _args):
    raise AssertionError("not invoked in this check")


def main() -> int:
    tools = json.load(sys.stdin)
    if not isinstance(tools, list) or not tools:
        print(f"expected a non-empty list of tools, got {tools!r}")
        return 1
    for tool in tools:
        if tool.get("type") != "function":
            print(f"not a function tool: {tool!r}")
            return 1
        function = FunctionDefinition.model_validate(tool["function"])
        if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", function.name):
            print(f"bad name {function.name!r}")
            return 1
        strict = bool(tool["function"].get("strict"))
        params = tool["function"]["parameters"]
        built = FunctionTool(
            name=function.name,
            description=function.description or "",
            params_json_schema=copy.deepcopy(params),
            on_invoke_tool=_never_called,
            strict_json_schema=strict,
        )
        if strict and ensure_strict_json_schema(copy.deepcopy(params)) != params:
            print(f"{function.name}: strict schema was rewritten by the SDK: {built.params_json_schema!r}")
            return 1
        print(f"ok {function.name} strict={strict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
