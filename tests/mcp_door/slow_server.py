"""A small MCP server on the official Python SDK, hosted by toolhost in the MCP door's tests.

`add` answers at once; `shape` takes arguments whose JSON Schema uses 2020-12 keywords
(`prefixItems` for a pair, `$defs` and `$ref` for a nested model), as pydantic writes them;
`slow` reports progress ten times a second until it is done, and when it
is cancelled it appends a line to `$SLOW_SERVER_MARKS/cancelled`, so a test can see that the
server was told (`notifications/cancelled` cancels the tool's task in the SDK); `ask` asks its
caller for a name (an elicitation whose schema requires a string `name`) and answers with what
the caller did.
"""

import os

import anyio
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

server = MCPServer("slow")
MARKS = os.environ.get("SLOW_SERVER_MARKS", ".")


class Sum(BaseModel):
    sum: int


@server.tool()
async def add(a: int, b: int) -> Sum:
    """Adds two numbers."""
    return Sum(sum=a + b)


class Corner(BaseModel):
    x: int
    y: int


@server.tool()
async def shape(size: tuple[int, int], corner: Corner) -> Sum:
    """The area of a `size` rectangle, plus its corner's coordinates."""
    return Sum(sum=size[0] * size[1] + corner.x + corner.y)


class Slept(BaseModel):
    slept: float


@server.tool()
async def slow(seconds: float, ctx: Context) -> Slept:
    """Sleeps for `seconds`, reporting progress every 100 ms."""
    steps = max(1, int(seconds * 10))
    try:
        for step in range(steps):
            await ctx.report_progress(step + 1, steps, f"step {step + 1} of {steps}")
            await anyio.sleep(0.1)
    except anyio.get_cancelled_exc_class():
        with open(os.path.join(MARKS, "cancelled"), "a", encoding="utf-8") as marks:
            marks.write("slow\n")
        raise
    return Slept(slept=seconds)


class Name(BaseModel):
    name: str


class Asked(BaseModel):
    action: str
    name: str | None = None


@server.tool()
async def ask(question: str, ctx: Context) -> Asked:
    """Asks the caller `question`, a form with a required `name`, and says what it answered."""
    answer = await ctx.elicit(question, Name)
    if answer.action == "accept":
        return Asked(action="accept", name=answer.data.name)
    return Asked(action=answer.action)


if __name__ == "__main__":
    server.run("stdio")
