"""Frames of the scaling testbed: round trips, and every malformed field refused with its name."""

from __future__ import annotations

import io
import struct

import pytest

from gfaas.errors import ProtocolError
from gfaas.policy.multicast import plan
from gfaas.scaling import frames as F
from gfaas.scaling.manager import step_bound_seconds
from gfaas.scaling.netns import Link


def _frames(*parts: tuple[str, dict, bytes]) -> io.BufferedReader:
    raw = io.BytesIO()
    for kind, meta, payload in parts:
        F.write_frame(raw, kind, meta, payload)
    return io.BufferedReader(io.BytesIO(raw.getvalue()))


def test_round_trip_and_clean_end() -> None:
    """Frames come back with kind, meta and payload; the stream's end between frames gives None."""
    src = _frames(("blk", {"block": 3, "step": 1}, b"abc" * 1000), ("go", {"step": 2}, b""))
    a = F.read_frame(src, 1 << 20)
    b = F.read_frame(src, 0)
    assert (a.kind, a.meta, bytes(a.payload)) == ("blk", {"block": 3, "step": 1}, b"abc" * 1000)
    assert (b.kind, b.meta, bytes(b.payload)) == ("go", {"step": 2}, b"")
    assert F.read_frame(src, 0) is None


def test_payload_lands_in_the_receivers_buffer_and_progress_sees_it_all() -> None:
    """``into`` places the payload in a pre-allocated buffer; ``progress`` sees every byte once."""
    buf = memoryview(bytearray(4096))
    seen = bytearray()
    fr = F.read_frame(_frames(("blk", {"block": 0}, bytes(range(256)) * 16)), 1 << 20,
                      lambda k, m, n: buf, seen.extend)
    assert fr.payload is buf and bytes(buf) == bytes(range(256)) * 16 and bytes(seen) == bytes(buf)


def test_wrong_size_for_the_buffer_is_refused_before_reading() -> None:
    """A payload of another size than the receiver's buffer is refused, naming both sizes."""
    with pytest.raises(ProtocolError, match="carries 10 bytes, the receiver expects 4"):
        F.read_frame(_frames(("blk", {}, b"x" * 10)), 100, lambda k, m, n: memoryview(bytearray(4)))


def test_oversized_payload_refused() -> None:
    """A payload over the reader's limit is refused from the header alone."""
    with pytest.raises(ProtocolError, match="payload of 11 bytes exceeds the limit 10"):
        F.read_frame(_frames(("blk", {}, b"x" * 11)), 10)


@pytest.mark.parametrize(("patch", "message"), [
    (lambda h: b"XXXX" + h[4:], "frame magic b'XXXX'"),
    (lambda h: h[:4] + bytes([200]) + h[5:], "frame kind code 200 is unknown"),
    (lambda h: h[:5] + b"\x01\0\0" + h[8:], "reserved bytes are 010000"),
    (lambda h: h[:8] + struct.pack("<I", F.MAX_META + 1) + h[12:], "meta length"),
])
def test_bad_header_fields(patch: object, message: str) -> None:
    """Each header field is checked: magic, kind, reserved bytes, meta length."""
    raw = F.encode_head("go", {"step": 1}, 0)
    bad = patch(raw[:F.HEAD_BYTES]) + raw[F.HEAD_BYTES:]  # type: ignore[operator]
    with pytest.raises(ProtocolError, match=message):
        F.read_frame(io.BufferedReader(io.BytesIO(bad)), 0)


def test_meta_must_be_a_json_object_and_stream_complete() -> None:
    """Meta that is not a JSON object, and a stream cut inside a frame, are refused."""
    head = struct.pack("<4sB3sIQ", F.MAGIC, F.KINDS.index("go"), b"\0\0\0", 3, 0)
    with pytest.raises(ProtocolError, match="meta is a list"):
        F.read_frame(io.BufferedReader(io.BytesIO(head + b"[1]")), 0)
    with pytest.raises(ProtocolError, match="stream ended after 1 of 3 bytes"):
        F.read_frame(io.BufferedReader(io.BytesIO(head + b"[")), 0)
    with pytest.raises(ProtocolError, match="unknown frame kind 'nope'"):
        F.encode_head("nope", {}, 0)


def test_need_checks_types() -> None:
    """``need`` returns a field of the right type and refuses others (a bool is not an int)."""
    assert F.need({"a": 3}, "a", int) == 3
    with pytest.raises(ProtocolError, match="frame field 'a' is True"):
        F.need({"a": True}, "a", int)
    with pytest.raises(ProtocolError, match="frame field 'b' is None"):
        F.need({}, "b", str)


def test_step_bound_counts_each_steps_largest_block() -> None:
    """The bound sums, over steps, the largest block sent in the step, at the link rate."""
    sched = plan(3, 2, 1, "chain")  # steps: [0->1 b0], [0->1 b1, 1->2 b0], [1->2 b1]
    assert step_bound_seconds(sched, [100, 300], 100.0) == (100 + 300 + 300) / 100.0
    assert Link(8.0).bytes_per_s == 1e6
    assert Link(80.0).shaping() == ("80000000bit", 65536, 1_000_000)
