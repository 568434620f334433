"""A reference OVOS ToolBox: `ovos_plugin_manager.templates.agent_tools.ToolBox` (3.1.0a1), bound
to a real `MessageBusClient`, with tools shaped like toolhost's built-in `echo` so the same checks
run against both.

    python reference_toolbox.py <port> <toolbox_id> [--flood N]

Prints `ready` on stdout once bound, then serves until killed. With `--flood N` every call is
answered N times and every discovery N times: a misbehaving toolbox for the source's tests.
"""

import os
import sys
import time

from ovos_bus_client import Message, MessageBusClient
from pydantic import field_validator
from ovos_plugin_manager.templates.agent_tools import AgentTool, ToolArguments, ToolBox, ToolOutput


class EchoArgs(ToolArguments):
    message: str


class EchoOutput(ToolOutput):
    message: str


class AddArgs(ToolArguments):
    a: int
    b: int


class AddOutput(ToolOutput):
    sum: int


class DivideArgs(ToolArguments):
    a: int
    b: int

    # A rule the JSON Schema does not carry: only the toolbox itself refuses b = 0.
    @field_validator("b")
    @classmethod
    def not_zero(cls, b: int) -> int:
        if b == 0:
            raise ValueError("b must not be 0")
        return b


class DivideOutput(ToolOutput):
    quotient: float


class NapArgs(ToolArguments):
    seconds: float


class NapOutput(ToolOutput):
    slept: float


def echo(args: EchoArgs) -> dict:
    return {"message": args.message}


def add(args: AddArgs) -> dict:
    return {"sum": args.a + args.b}


def divide(args: DivideArgs) -> dict:
    return {"quotient": args.a / args.b}


def nap(args: NapArgs) -> dict:
    # The tests wait for this mark to know the call reached the toolbox.
    if os.environ.get("NAP_MARK"):
        with open(os.environ["NAP_MARK"], "a") as mark:
            mark.write("nap\n")
    time.sleep(args.seconds)
    return {"slept": args.seconds}


def broken(args: EchoArgs) -> dict:
    return {"not": "the output schema"}


class ReferenceToolBox(ToolBox):
    def discover_tools(self):
        return [
            AgentTool("echo", "Return the message.", EchoArgs, EchoOutput, echo),
            AgentTool("add", "Add two integers.", AddArgs, AddOutput, add),
            AgentTool("divide", "Divide a by b.", DivideArgs, DivideOutput, divide),
            AgentTool("nap", "Sleep a while.", NapArgs, NapOutput, nap),
            AgentTool("broken", "Answer with the wrong shape.", EchoArgs, EchoOutput, broken),
        ]


class FloodingToolBox(ReferenceToolBox):
    """Answers every call and every discovery `flood` times."""

    flood = 1

    def handle_discover(self, message: Message) -> None:
        for _ in range(self.flood):
            super().handle_discover(message)

    def handle_call(self, message: Message) -> None:
        for _ in range(self.flood):
            super().handle_call(message)


def main() -> None:
    port, toolbox_id = int(sys.argv[1]), sys.argv[2]
    flood = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--flood" else 1
    bus = MessageBusClient(host="127.0.0.1", port=port, route="/core")
    bus.run_in_thread()
    if not bus.connected_event.wait(20):
        print("cannot connect to the bus", file=sys.stderr)
        sys.exit(1)
    if flood > 1:
        FloodingToolBox.flood = flood
        FloodingToolBox(toolbox_id, bus=bus)
    else:
        ReferenceToolBox(toolbox_id, bus=bus)
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
