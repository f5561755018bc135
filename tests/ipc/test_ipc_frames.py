"""The frame decoder alone: bytes and fds in, events out, no sockets."""

import os

import pytest

from sockherd.ipc.errors import ProtocolError
from sockherd.ipc.frames import (ACK_FRAME, FD_BATCH, HEADER, KIND_FDS, KIND_MSG, MAGIC,
                                 MAX_FRAME, VERSION, Delivered, FrameDecoder, GotAck, SendAck,
                                 encode_frames)

from ipc_fdcount import devnull_fds, is_open


def header(kind=KIND_MSG, nfds=0, length=0, magic=MAGIC, version=VERSION) -> bytes:
    return HEADER.pack(magic, version, kind, nfds, length)


def test_message_without_fds_fed_byte_by_byte():
    (data, fds), = encode_frames(b"payload", [])
    decoder = FrameDecoder()
    events = []
    for i in range(len(data)):
        events += decoder.feed(data[i:i + 1])
    assert events == [Delivered(b"payload", [])]
    assert decoder.at_boundary


def test_fds_claimed_by_the_frame_they_arrive_with():
    fds = devnull_fds(2)
    (data, _), = encode_frames(b"x", fds)
    decoder = FrameDecoder()
    # The fds come with the first byte; the rest of the frame trickles in afterwards.
    assert decoder.feed(data[:1], fds) == []
    assert decoder.feed(data[1:]) == [Delivered(b"x", fds)]
    for fd in fds:
        os.close(fd)


def test_two_frames_in_one_chunk():
    a, = encode_frames(b"a", [])
    b, = encode_frames(b"bb", [])
    assert FrameDecoder().feed(a[0] + b[0]) == [Delivered(b"a", []), Delivered(b"bb", [])]


def test_large_fd_set_asks_for_an_ack_between_batches():
    fds = list(range(1000, 1000 + 2 * FD_BATCH + 5))     # numbers only: never closed here
    units = encode_frames(b"big", fds)
    assert [len(batch) for _, batch in units] == [FD_BATCH, FD_BATCH, 5]
    decoder = FrameDecoder()
    assert decoder.feed(*units[0]) == [SendAck()]
    assert decoder.feed(ACK_FRAME) == [GotAck()]           # the peer's own acks may interleave
    assert decoder.feed(*units[1]) == [SendAck()]
    assert decoder.feed(*units[2]) == [Delivered(b"big", fds)]


@pytest.mark.parametrize("raw, announced, sent, message", [
    (header(nfds=3, length=0), 3, 2, "frame header announces 3 fds, received 2"),
    (header(length=20_000_000), 0, 0, f"frame of 20000000 bytes exceeds cap {MAX_FRAME}"),
    (header(version=9), 0, 0, "protocol version 9, expected 1"),
    (header(magic=b"GE"), 0, 0, "bad frame magic b'GE', expected b'SH'"),
    (header(kind=7), 0, 0, "unknown frame kind 7"),
    (header(kind=KIND_FDS, nfds=1), 1, 1, "fd batch frame outside a message"),
    (header(nfds=300, length=1), 300, 100,
     "frame header announces 300 fds, received 100 of its first batch of 252"),
    (header(nfds=0, length=1) + b"x", 0, 1, "received 1 fds not announced by any frame"),
])
def test_bad_frames_name_the_problem_and_close_every_fd(raw, announced, sent, message):
    fds = devnull_fds(sent)
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError) as info:
        decoder.feed(raw, fds)
    assert str(info.value) == message
    assert not any(is_open(fd) for fd in fds)
    # The stream is desynchronised for good: later input is refused, and its fds closed.
    more = devnull_fds(1)
    with pytest.raises(ProtocolError, match="channel already failed"):
        decoder.feed(b"anything", more)
    assert not is_open(more[0])


def test_error_closes_fds_of_frames_completed_in_the_same_chunk():
    fds = devnull_fds(1)
    (good, _), = encode_frames(b"ok", fds)
    with pytest.raises(ProtocolError, match="protocol version 2"):
        FrameDecoder().feed(good + header(version=2), fds)
    assert not is_open(fds[0])


def test_eof_mid_frame_is_an_error_and_closes_fds():
    fds = devnull_fds(2)
    (data, _), = encode_frames(b"0123456789", fds)
    decoder = FrameDecoder()
    decoder.feed(data[:-3], fds)
    with pytest.raises(ProtocolError, match="peer closed the channel mid-frame: got 7 of 10"):
        decoder.eof()
    assert not any(is_open(fd) for fd in fds)


def test_eof_between_frames_is_fine():
    decoder = FrameDecoder()
    decoder.feed(encode_frames(b"", [])[0][0])
    decoder.eof()


def test_encoder_refuses_oversized_payload():
    with pytest.raises(ValueError, match="exceeds cap 10"):
        encode_frames(b"x" * 11, [], max_frame=10)
