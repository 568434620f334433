"""Content blocks: what a tool answers beside its `result` when it gave more than text (an
image, audio, a resource link or an embedded resource), as the daemon's docs/CONTRACTS.md,
"Content blocks", describes them. They are MCP's blocks, `annotations` and `_meta` kept."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any, Union

from ._errors import ClientError


@dataclass(frozen=True)
class TextBlock:
    """A text block."""

    text: str
    annotations: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None


@dataclass(frozen=True)
class ImageBlock:
    """An image: `data` is its bytes (decoded from the wire's base64)."""

    data: bytes
    mime_type: str
    annotations: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None

    def data_url(self) -> str:
        """The image as a `data:` URL, for a browser or a model that takes image URLs."""
        return f"data:{self.mime_type};base64,{base64.b64encode(self.data).decode()}"


@dataclass(frozen=True)
class AudioBlock:
    """Audio: `data` is its bytes (decoded from the wire's base64)."""

    data: bytes
    mime_type: str
    annotations: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None


@dataclass(frozen=True)
class ResourceLink:
    """A link to a resource the tool's server can read (`uri`), not its content."""

    uri: str
    name: str
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    size: int | None = None
    annotations: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None


@dataclass(frozen=True)
class EmbeddedResource:
    """A resource's content: `text`, or `blob` (its bytes, decoded from base64)."""

    uri: str
    mime_type: str | None = None
    text: str | None = None
    blob: bytes | None = None
    annotations: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None


Block = Union[TextBlock, ImageBlock, AudioBlock, ResourceLink, EmbeddedResource]


@dataclass(frozen=True)
class Reply:
    """A call's whole answer: its `result`, and its content blocks (empty when the tool gave
    nothing more than the result says)."""

    result: Any
    content: tuple[Block, ...] = field(default=())

    def images(self) -> list[ImageBlock]:
        """The image blocks, in order."""
        return [block for block in self.content if isinstance(block, ImageBlock)]


def parse_blocks(raw: object) -> tuple[Block, ...]:
    """The typed blocks of an answer's `content` (absent: none); a ClientError names a block
    that is not one MCP defines, which a daemon never sends."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ClientError(f"an answer's content must be a list of blocks, not {type(raw).__name__}")
    return tuple(_block(index, block) for index, block in enumerate(raw))


def _block(index: int, raw: object) -> Block:
    if not isinstance(raw, dict):
        raise ClientError(f"content block {index} is not an object")
    kind = raw.get("type")
    annotations = _optional_dict(raw.get("annotations"))
    meta = _optional_dict(raw.get("_meta"))
    where = f"content block {index} ({kind})"
    if kind == "text":
        return TextBlock(_string(raw, "text", where), annotations, meta)
    if kind == "image":
        return ImageBlock(_base64(raw, "data", where), _string(raw, "mimeType", where), annotations, meta)
    if kind == "audio":
        return AudioBlock(_base64(raw, "data", where), _string(raw, "mimeType", where), annotations, meta)
    if kind == "resource_link":
        size = raw.get("size")
        return ResourceLink(
            uri=_string(raw, "uri", where),
            name=_string(raw, "name", where),
            title=_optional_string(raw.get("title")),
            description=_optional_string(raw.get("description")),
            mime_type=_optional_string(raw.get("mimeType")),
            size=size if isinstance(size, int) else None,
            annotations=annotations,
            meta=meta,
        )
    if kind == "resource":
        resource = raw.get("resource")
        if not isinstance(resource, dict):
            raise ClientError(f"{where} has no resource object")
        text = resource.get("text")
        return EmbeddedResource(
            uri=_string(resource, "uri", where),
            mime_type=_optional_string(resource.get("mimeType")),
            text=text if isinstance(text, str) else None,
            blob=_base64(resource, "blob", where) if "blob" in resource else None,
            annotations=annotations,
            meta=meta,
        )
    raise ClientError(f"content block {index} has a type MCP does not define: {kind!r}")


def _string(raw: dict[str, Any], name: str, where: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str):
        raise ClientError(f"{where} has no string {name!r}")
    return value


def _base64(raw: dict[str, Any], name: str, where: str) -> bytes:
    try:
        return base64.b64decode(_string(raw, name, where), validate=True)
    except binascii.Error as err:
        raise ClientError(f"{where}: its {name!r} is not base64 ({err})") from None


def _optional_string(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _optional_dict(value: object) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None
