"""The shard rule of docs/CONTRACTS.md ("Sharded requests streams"), as the daemon computes it:
the documented tag table, CRC16/XMODEM, and the kinds of request. Needs no Redis."""

from toolhost import _wire


def test_the_documented_tags() -> None:
    def tags(count: int) -> list[str]:
        return [_wire.shard_tag(k, count) for k in range(count)]

    assert tags(2) == ["2", "0"]
    assert tags(3) == ["3", "c", "0"]
    assert tags(4) == ["3", "2", "1", "0"]
    assert tags(6) == ["3", "j", "c", "1", "h", "a"]
    assert tags(8) == ["e0", "b", "20", "c", "g0", "d", "00", "a"]


def test_the_shard_of_a_request() -> None:
    assert _wire.crc16(b"123456789") == 0x31C3
    # 0x31C3 = 12739, and 12739 mod 6 = 1: shard 1's tag is "j".
    assert _wire.shard_stream("action-requests", 6, "tool.invoke", "123456789") == "action-requests:{j}"
    assert _wire.shard_stream("action-requests", 6, "tool.cancel", "123456789") == "action-requests:{j}"
    assert _wire.shard_stream("action-requests", 6, "tools.discover", "123456789") == "action-requests:{3}"
    assert _wire.shard_stream("action-requests", 1, "tool.invoke", "123456789") == "action-requests"
