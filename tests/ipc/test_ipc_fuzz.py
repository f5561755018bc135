"""Hypothesis against the receive side: garbage, truncated and oversized frames, wrong fd
counts, peers that die mid-message, well-framed payloads with hostile msgpack inside (any
bytes in strings, deep nesting) and fds that are no listener where listeners are expected.
The only acceptable outcomes are messages or our own exceptions, and the process holds
exactly as many fds afterwards as before. (The hand-off server and client against each
other's garbage: test_ipc_fuzz_handoff.py.)"""

import os
import shutil
import socket
import tempfile
from array import array

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from sockherd.ipc import messages as m
from sockherd.ipc.channel import Channel
from sockherd.ipc.errors import IPCError, ListenerMismatch, MessageError
from sockherd.ipc.frames import (FD_BATCH, HEADER, KIND_ACK, KIND_FDS, KIND_MSG, MAGIC,
                                 VERSION, Delivered, FrameDecoder, encode_frames)
from sockherd.ipc.listeners import adopt, describe
from sockherd.ipc.nesting import first_too_deep

from ipc_fdcount import devnull_fds, open_fd_count, open_fd_of_kind
from ipc_msgpack import any_value, depth, message_tree, pack

FUZZ = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

valid_message = st.sampled_from([
    m.Stop(), m.Ready(pid=1), m.Heartbeat(seq=1, sent_at=0.0), m.Drain(deadline=1.0),
    m.Error(message="x"), m.StatsReply(request_id=1, stats={"a": 1}),
    m.Assignment(generation=1, worker_index=0, config={}, app="a:b"),
])

header = st.builds(
    HEADER.pack,
    st.sampled_from([MAGIC, MAGIC, MAGIC, b"GE", b"\x00\x00"]),
    st.sampled_from([VERSION, VERSION, VERSION, 0, 2, 255]),
    st.sampled_from([KIND_MSG, KIND_MSG, KIND_FDS, KIND_ACK, 0, 9]),
    st.one_of(st.integers(0, 3), st.integers(250, 700), st.just(2**32 - 1)),
    st.one_of(st.integers(0, 40), st.just(20_000_000), st.just(2**32 - 1)),
)


def announcing(msg_and_count) -> bytes:
    """A well-formed message frame announcing fds that may or may not come along."""
    msg, nfds = msg_and_count
    payload = m.encode(msg)
    return HEADER.pack(MAGIC, VERSION, KIND_MSG, nfds, len(payload)) + payload


def framed(payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, VERSION, KIND_MSG, 0, len(payload)) + payload


piece = st.one_of(
    valid_message.map(lambda msg: encode_frames(m.encode(msg), [])[0][0]),
    message_tree.map(pack).map(framed),
    st.tuples(valid_message, st.sampled_from([1, 2, 3, FD_BATCH + 2, 3 * FD_BATCH])).map(announcing),
    st.just(HEADER.pack(MAGIC, VERSION, KIND_FDS, 2, 0)),
    st.just(HEADER.pack(MAGIC, VERSION, KIND_FDS, FD_BATCH, 0)),
    st.just(HEADER.pack(MAGIC, VERSION, KIND_ACK, 0, 0)),
    header,
    st.tuples(header, st.binary(max_size=40)).map(b"".join),
    st.binary(min_size=1, max_size=64),
)


@st.composite
def stream(draw):
    """A byte stream cut into non-empty chunks, each with a number of fds to attach."""
    data = b"".join(draw(st.lists(piece, min_size=1, max_size=8)))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=6)))
    chunks = [data[i:j] for i, j in zip([0] + cuts, cuts + [len(data)]) if data[i:j]]
    # A full batch now and then reaches the large-message path (ACKs, FDS frames).
    counts = st.sampled_from([0, 0, 0, 1, 2, 3, FD_BATCH])
    return [(chunk, draw(counts)) for chunk in chunks]


@FUZZ
@given(stream(), st.booleans())
def test_decoder_never_crashes_nor_leaks(chunks, eof):
    before = open_fd_count()
    decoder = FrameDecoder()
    try:
        for data, nfds in chunks:
            for event in decoder.feed(data, devnull_fds(nfds)):
                if isinstance(event, Delivered):
                    for fd in event.fds:
                        os.close(fd)
                    try:
                        m.decode(event.payload)
                    except MessageError:
                        pass
        if eof:
            decoder.eof()
    except IPCError:
        pass
    finally:
        decoder.close()
    assert open_fd_count() == before


@FUZZ
@given(stream(), st.booleans())
def test_receive_path_never_crashes_nor_leaks(chunks, too_many_fds):
    before = open_fd_count()
    raw, ours = socket.socketpair()
    channel = Channel(ours)
    try:
        # Everything is written before the peer "dies" (closes), often mid-frame; it all
        # fits in the socket buffer, so no reader is needed yet.
        for i, (data, nfds) in enumerate(chunks):
            if too_many_fds and i == len(chunks) // 2:
                nfds = FD_BATCH + 1          # one batch too many: MSG_CTRUNC on our side
            fds = devnull_fds(nfds)
            try:
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))] if fds else []
                raw.sendmsg([data], ancillary)
            finally:
                for fd in fds:
                    os.close(fd)
        raw.close()
        while True:
            try:
                channel.recv(timeout=10).close_fds()
            except MessageError:
                continue                      # framing intact: keep reading
            except IPCError:
                break                         # protocol error or peer gone: done
    finally:
        channel.close()
        if raw.fileno() != -1:
            raw.close()
    assert open_fd_count() == before


# -- payloads: well-framed, hostile inside ---------------------------------------------------

@FUZZ
@given(message_tree)
def test_decode_raises_nothing_but_message_error(tree):
    payload = pack(tree)
    try:
        msg = m.decode(payload)
    except MessageError as exc:
        if depth(tree) > m.MAX_DEPTH:
            assert "nests deeper than" in str(exc)
        return
    assert depth(tree) <= m.MAX_DEPTH
    assert m.decode(m.encode(msg)) == msg


@FUZZ
@given(any_value, st.integers(0, m.MAX_DEPTH + 3))
def test_nesting_bound_agrees_with_the_reference_depth(tree, limit):
    payload = pack(tree)
    offset = first_too_deep(payload, limit)
    assert (offset is None) == (depth(tree) <= limit)
    if offset is not None:
        assert payload[offset] in b"\x80\x81\x82\x83\x84\x85\x86\x87\x88\x89\x8a\x8b\x8c\x8d\x8e\x8f" \
            b"\x90\x91\x92\x93\x94\x95\x96\x97\x98\x99\x9a\x9b\x9c\x9d\x9e\x9f\xdc\xdd\xde\xdf"


# -- fds that are no listener where listeners are expected -----------------------------------

FD_KINDS = ["listener", "listener", "o_path_socket", "o_path_file", "o_path_dir", "file",
            "dir", "pipe", "eventfd", "chardev", "not_listening", "dgram"]


@pytest.fixture(scope="module")
def path_listener():
    directory = tempfile.mkdtemp(prefix="sh-")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.path.join(directory, "l.sock"))
    sock.listen()
    yield sock
    sock.close()
    shutil.rmtree(directory)


@settings(FUZZ, max_examples=60)
@given(kinds=st.lists(st.sampled_from(FD_KINDS), min_size=1, max_size=6),
       assignment=st.booleans(), extra_descs=st.integers(-1, 1))
def test_non_sockets_for_listeners_are_refused_and_nothing_leaks(path_listener, kinds,
                                                                  assignment, extra_descs):
    before = open_fd_count()
    descs = [describe(path_listener, f"l{i}") for i in range(len(kinds) + extra_descs)]
    msg = (m.Assignment(generation=1, worker_index=0, config={}, app="a:b", listeners=descs)
           if assignment else m.HandoffListeners(descs))
    a, b = Channel.pair()
    try:
        fds = [open_fd_of_kind(kind, path_listener) for kind in kinds]
        try:
            a.send(msg, fds, timeout=10)             # sends duplicates of ours
        finally:
            for fd in fds:
                os.close(fd)
        try:
            got = b.recv(timeout=10)
        except MessageError as exc:
            assert extra_descs and "fds, expects" in str(exc)
            return
        assert not extra_descs
        try:
            socks = adopt(got.msg.listeners, got.fds)
        except ListenerMismatch:
            assert set(kinds) != {"listener"}
        else:
            assert set(kinds) == {"listener"}
            for sock in socks:
                sock.close()
    finally:
        a.close()
        b.close()
        assert open_fd_count() == before
