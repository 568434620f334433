"""toolhost: call the tools a toolhost fleet hosts, over Redis.

    from toolhost import Client
    with Client("redis://127.0.0.1:6379/0") as c:
        c.call("echo", {"message": "hi"})

See the README's "Calling from Python" and the daemon's docs/CONTRACTS.md for the wire.
"""

from ._aio import AsyncClient
from ._content import AudioBlock, Block, EmbeddedResource, ImageBlock, Reply, ResourceLink, TextBlock
from ._errors import (
    Cancelled,
    ClientClosed,
    ClientError,
    ConnectionFailed,
    Expired,
    Forbidden,
    Internal,
    Interrupted,
    InvalidArguments,
    InvalidOutput,
    InvalidRequest,
    NoAnswer,
    Overloaded,
    RequestNotReplicated,
    ToolDisabled,
    ToolError,
    ToolFailed,
    ToolTimeout,
    UnknownTool,
)
from ._sync import Client
from ._wire import Finished, InputRequest, LogEntry, Progress

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AudioBlock",
    "Block",
    "Cancelled",
    "Client",
    "ClientClosed",
    "ClientError",
    "ConnectionFailed",
    "EmbeddedResource",
    "Expired",
    "Finished",
    "Forbidden",
    "ImageBlock",
    "InputRequest",
    "Internal",
    "Interrupted",
    "InvalidArguments",
    "InvalidOutput",
    "InvalidRequest",
    "LogEntry",
    "NoAnswer",
    "Overloaded",
    "Progress",
    "Reply",
    "RequestNotReplicated",
    "ResourceLink",
    "TextBlock",
    "ToolDisabled",
    "ToolError",
    "ToolFailed",
    "ToolTimeout",
    "UnknownTool",
    "__version__",
]
