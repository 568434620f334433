"""What an OVOS persona does on the bus, with the real `MessageBusClient`, against one toolbox id:
toolhost's door or a reference `ToolBox` (reference_toolbox.py). Each scenario prints one JSON
report as its last line; the Rust tests (tests/tests/ovos.rs) compare the reports of both.

    python scenarios.py check <port> <toolbox_id>      discovery, calls on both topics, every error
    python scenarios.py bad-input <port> <toolbox_id>  frames that are not messages, a 10 MiB
                                                        frame, each followed by a call (toolhost only:
                                                        a non-JSON frame makes a MessageBusClient drop
                                                        its connection)
    python scenarios.py call <port> <toolbox_id> <name> <kwargs-json>   one call, its replies
    python scenarios.py fire <port> <toolbox_id> <name> <kwargs-json>   one call, not waited for
    python scenarios.py announced <port> <toolbox_id> <tool> <seconds>  waits for an unsolicited
                                                        discovery response listing <tool>

Every message carries a unique `context.call_id`; the replies keep the request's context, so
each reply is matched to its request, and a request with more than one reply is seen.
"""

import json
import sys
import threading
import time
import uuid

import websocket
from ovos_bus_client import Message, MessageBusClient

DISCOVER = "ovos.persona.tools.discover"
STATIC_CALL = "ovos.persona.tools.call"
# How long replies are collected after the last one was expected, to see a second reply.
SETTLE = 1.5


class Persona:
    def __init__(self, port: int, toolbox_id: str):
        self.toolbox_id = toolbox_id
        self.bus = MessageBusClient(host="127.0.0.1", port=port, route="/core")
        self.replies: list = []
        self.lock = threading.Lock()
        self.bus.run_in_thread()
        if not self.bus.connected_event.wait(20):
            raise SystemExit("cannot connect to the bus")
        for msg_type in (
            f"{DISCOVER}.response",
            f"{STATIC_CALL}.response",
            f"ovos.persona.tools.{toolbox_id}.call.response",
        ):
            self.bus.on(msg_type, self._collect)

    def _collect(self, message: Message) -> None:
        with self.lock:
            self.replies.append({"type": message.msg_type, "data": message.data, "context": message.context})

    def replies_to(self, call_id: str) -> list:
        with self.lock:
            return [reply for reply in self.replies if reply["context"].get("call_id") == call_id]

    def send(self, msg_type: str, data: dict, context: dict | None = None) -> str:
        call_id = uuid.uuid4().hex
        context = dict(context or {})
        context["call_id"] = call_id
        self.bus.emit(Message(msg_type, data, context))
        return call_id

    def wait(self, call_id: str, timeout: float = 20.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            replies = self.replies_to(call_id)
            if replies:
                return replies
            time.sleep(0.02)
        return []

    def call(self, data: dict, static: bool = False, context: dict | None = None) -> str:
        if static:
            return self.send(STATIC_CALL, {"toolbox_id": self.toolbox_id, **data}, context)
        return self.send(f"ovos.persona.tools.{self.toolbox_id}.call", data, context)

    def close(self) -> None:
        self.bus.close()


# The calls of `check`: (label, data, topic form, whether the call reaches a tool host).
LONG_NAME = "n" * 65
CALLS = [
    ("echo", {"name": "echo", "kwargs": {"message": "hi"}}, "toolbox", True),
    ("echo_static", {"name": "echo", "kwargs": {"message": "static"}}, "static", True),
    ("invalid_type", {"name": "echo", "kwargs": {"message": 5}}, "toolbox", True),
    ("invalid_static", {"name": "echo", "kwargs": {"message": ["x"]}}, "static", True),
    ("missing_kwargs", {"name": "echo"}, "toolbox", True),
    ("unknown", {"name": "nope", "kwargs": {}}, "toolbox", False),
    ("unknown_static", {"name": "nope"}, "static", False),
    ("kwargs_list", {"name": "echo", "kwargs": [1, 2]}, "toolbox", False),
    ("kwargs_str", {"name": "echo", "kwargs": "message=hi"}, "toolbox", False),
    ("kwargs_int", {"name": "echo", "kwargs": 5}, "toolbox", False),
    ("kwargs_float", {"name": "echo", "kwargs": 2.5}, "toolbox", False),
    ("kwargs_bool", {"name": "echo", "kwargs": True}, "toolbox", False),
    ("kwargs_null", {"name": "echo", "kwargs": None}, "static", False),
    ("unknown_and_kwargs_list", {"name": "nope", "kwargs": [1]}, "toolbox", False),
    ("name_missing", {"kwargs": {}}, "toolbox", False),
    ("name_null", {"name": None}, "toolbox", False),
    ("name_int", {"name": 5}, "toolbox", False),
    ("name_bool", {"name": False}, "toolbox", False),
    ("name_list", {"name": ["echo"]}, "toolbox", False),
    ("name_dict", {"name": {"a": 1}}, "static", False),
    ("name_long", {"name": LONG_NAME, "kwargs": {}}, "toolbox", False),
]


def check(port: int, toolbox_id: str) -> dict:
    persona = Persona(port, toolbox_id)
    report: dict = {"toolbox_id": toolbox_id, "calls": {}, "host_calls": 0}
    # Discovery: the responses of this toolbox to this request.
    discover_id = persona.send(DISCOVER, {})
    persona.wait(discover_id)
    # Calls, one at a time.
    for label, data, form, host in CALLS:
        call_id = persona.call(data, static=form == "static")
        persona.wait(call_id)
        report["calls"][label] = call_id
        report["host_calls"] += int(host)
    # A call with no data, and one with null data: `Message.deserialize` reads both as {}.
    for label, frame in (("no_data", {}), ("data_null", {"data": None})):
        call_id = uuid.uuid4().hex
        persona.bus.client.send(json.dumps({"type": f"ovos.persona.tools.{toolbox_id}.call",
                                            "context": {"call_id": call_id}, **frame}))
        persona.wait(call_id)
        report["calls"][label] = call_id
    # Static calls for another toolbox and for none: silence.
    other = persona.send(STATIC_CALL, {"toolbox_id": "someone-else", "name": "echo", "kwargs": {"message": "x"}})
    nobody = persona.send(STATIC_CALL, {"name": "echo", "kwargs": {"message": "x"}})
    # The context round trip: every key kept, source and destination swapped.
    sent_context = {
        "source": "persona.test",
        "destination": toolbox_id,
        "session": {"session_id": "s-42", "lang": "pt-PT", "site_id": "kitchen"},
        "custom": {"nested": [1, {"k": "v"}], "flag": True},
    }
    context_id = persona.call({"name": "echo", "kwargs": {"message": "ctx"}}, context=sent_context)
    persona.wait(context_id)
    report["host_calls"] += 1
    time.sleep(SETTLE)
    replies = {label: persona.replies_to(call_id) for label, call_id in report["calls"].items()}
    report["calls"] = {
        label: {"count": len(found), "type": found[0]["type"] if found else None,
                "data": found[0]["data"] if found else None}
        for label, found in replies.items()
    }
    discovered = [reply for reply in persona.replies_to(discover_id) if reply["data"].get("toolbox_id") == toolbox_id]
    report["discover"] = {
        "count": len(discovered),
        "data_keys": sorted(discovered[0]["data"]) if discovered else [],
        "tools": {tool.get("name"): {"keys": sorted(tool), "toolbox_id": tool.get("toolbox_id")}
                  for tool in (discovered[0]["data"].get("tools", []) if discovered else [])},
        "echo": next((tool for tool in (discovered[0]["data"].get("tools", []) if discovered else [])
                      if tool.get("name") == "echo"), None),
    }
    report["silent"] = {"other_toolbox": len(persona.replies_to(other)), "no_toolbox": len(persona.replies_to(nobody))}
    context_replies = persona.replies_to(context_id)
    report["context"] = {
        "count": len(context_replies),
        "sent": {**sent_context, "call_id": context_id},
        "received": context_replies[0]["context"] if context_replies else None,
    }
    persona.close()
    return report


class Raw:
    """A plain websocket client of the bus (websocket-client, which ovos-bus-client uses): it
    sends frames that are not messages, which would make a `MessageBusClient` drop its own
    connection, and reads the replies itself."""

    def __init__(self, port: int):
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}/core", timeout=20)
        self.ws.settimeout(0.2)
        self.replies: list = []

    def send(self, frame: str) -> None:
        self.ws.send(frame)

    def call(self, msg_type: str, data, call_id: str) -> None:
        self.send(json.dumps({"type": msg_type, "data": data, "context": {"call_id": call_id}}))

    def pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                frame = self.ws.recv()
            except websocket.WebSocketTimeoutException:
                continue
            try:
                message = json.loads(frame)
            except ValueError:
                continue
            if isinstance(message, dict) and str(message.get("type", "")).endswith(".response"):
                self.replies.append(message)

    def replies_to(self, call_id: str) -> list:
        return [reply.get("data") for reply in self.replies
                if isinstance(reply.get("context"), dict) and reply["context"].get("call_id") == call_id]

    def wait(self, call_id: str, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.replies_to(call_id):
            self.pump(0.1)
        return self.replies_to(call_id)


def bad_input(port: int, toolbox_id: str) -> dict:
    raw = Raw(port)
    topic = f"ovos.persona.tools.{toolbox_id}.call"
    # Frames that are not messages: each is skipped (and logged); no reply.
    frames = [
        "not json at all {",
        "[1, 2, 3]",
        '"a string"',
        json.dumps({"data": {"name": "echo", "kwargs": {"message": "no type"}}, "context": {"call_id": "no-type"}}),
        json.dumps({"type": 5, "data": {"name": "echo"}, "context": {"call_id": "type-int"}}),
        json.dumps({"type": topic, "data": [1, 2], "context": {"call_id": "data-list"}}),
        json.dumps({"type": topic, "data": {"name": "echo", "kwargs": {"message": "x"}}, "context": "ctx"}),
    ]
    for frame in frames:
        raw.send(frame)
    raw.pump(SETTLE)
    report: dict = {label: len(raw.replies_to(label)) for label in ("no-type", "type-int", "data-list")}
    report["replies"] = len(raw.replies)
    raw.call(topic, {"name": "echo", "kwargs": {"message": "after bad frames"}}, "probe")
    report["probe"] = raw.wait("probe", 20)
    report["answered_probes"] = len(report["probe"])
    # A frame over the door's max_frame_bytes (the bus itself takes up to its max_msg_size).
    raw.send(json.dumps({"type": "ovos.test.big", "data": {"blob": "x" * (10 * 1024 * 1024)}, "context": {}}))
    # Then calls until one is answered: the door connects again after a frame it cannot read.
    answered = None
    deadline = time.monotonic() + 30
    attempt = 0
    while answered is None and time.monotonic() < deadline:
        attempt += 1
        call_id = f"big-{attempt}"
        raw.call(topic, {"name": "echo", "kwargs": {"message": "after the big frame"}}, call_id)
        found = raw.wait(call_id, 0.5)
        if found:
            answered = found[0]
    raw.pump(SETTLE)
    report["after_big_frame"] = answered
    report["answered_probes"] += sum(len(raw.replies_to(f"big-{n}")) for n in range(1, attempt + 1))
    raw.ws.close()
    return report


def call(port: int, toolbox_id: str, name: str, kwargs: str, wait: bool = True) -> dict:
    persona = Persona(port, toolbox_id)
    call_id = persona.call({"name": name, "kwargs": json.loads(kwargs)})
    if not wait:
        time.sleep(0.5)
        persona.close()
        return {"sent": call_id}
    replies = persona.wait(call_id, timeout=60)
    time.sleep(SETTLE)
    replies = persona.replies_to(call_id)
    persona.close()
    return {"count": len(replies), "data": replies[0]["data"] if replies else None}


def announced(port: int, toolbox_id: str, tool: str, seconds: float) -> dict:
    persona = Persona(port, toolbox_id)
    print("listening", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with persona.lock:
            for reply in persona.replies:
                data = reply["data"]
                if (reply["type"] == f"{DISCOVER}.response" and data.get("toolbox_id") == toolbox_id
                        and any(t.get("name") == tool for t in data.get("tools", []))):
                    persona.close()
                    return {"announced": True, "context": reply["context"]}
        time.sleep(0.05)
    persona.close()
    return {"announced": False}


def main() -> None:
    command, port, toolbox_id = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if command == "check":
        report = check(port, toolbox_id)
    elif command == "bad-input":
        report = bad_input(port, toolbox_id)
    elif command == "call":
        report = call(port, toolbox_id, sys.argv[4], sys.argv[5])
    elif command == "fire":
        report = call(port, toolbox_id, sys.argv[4], sys.argv[5], wait=False)
    elif command == "announced":
        report = announced(port, toolbox_id, sys.argv[4], float(sys.argv[5]))
    else:
        raise SystemExit(f"unknown scenario {command}")
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
