"""An OVOS persona's one call for the telemetry tests, with the real `MessageBusClient` (run by
the OVOS venv's Python, `scripts/ensure-ovos-venv.sh`): it sends a call to toolhost's OVOS door
whose message context carries the given `traceparent`, waits for the reply and prints it as one
JSON line.

    ovos_caller.py <port> <toolbox_id> <tool> <kwargs JSON> <traceparent>
"""

import json
import sys
import threading
import uuid

from ovos_bus_client import Message, MessageBusClient


def main() -> None:
    port, toolbox_id, tool, kwargs, traceparent = sys.argv[1:]
    topic = f"ovos.persona.tools.{toolbox_id}.call"
    bus = MessageBusClient(host="127.0.0.1", port=int(port), route="/core")
    replies: list = []
    answered = threading.Event()
    call_id = uuid.uuid4().hex

    def collect(message: Message) -> None:
        if message.context.get("call_id") == call_id:
            replies.append(message.data)
            answered.set()

    bus.on(f"{topic}.response", collect)
    bus.run_in_thread()
    if not bus.connected_event.wait(20):
        raise SystemExit("cannot connect to the bus")
    context = {"call_id": call_id, "traceparent": traceparent}
    bus.emit(Message(topic, {"name": tool, "kwargs": json.loads(kwargs)}, context))
    answered.wait(30)
    bus.close()
    print(json.dumps({"replies": replies}), flush=True)


if __name__ == "__main__":
    main()
