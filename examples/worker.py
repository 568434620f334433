"""An example agent worker: calls toolhost's `echo` tool with the Python client and prints the
answer.

docker-compose.yml runs it once toolhost is ready. Outside compose:

    pip install ./clients/python
    REDIS_URL=redis://127.0.0.1:6379 python examples/worker.py

It does what any agent does: call a tool by name with its arguments and get the result, or a
typed error. The client sends the request to `action-requests` and reads the answer on a
stream of its own, `results:<client id>`, which it deletes when it closes.
"""

import sys

from toolhost import Client, NoAnswer, ToolError


def main() -> int:
    with Client() as client:  # REDIS_URL, else redis://127.0.0.1:6379/0
        try:
            result = client.call("echo", {"message": "hello from the example worker"}, timeout=30.0)
        except ToolError as err:
            print(f"echo failed: {err}", file=sys.stderr)
            return 1
        except NoAnswer as err:
            print(err, file=sys.stderr)
            return 1
    print(f"echo answered: {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
