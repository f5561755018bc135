"""Hypothesis against the receive side: garbage, truncated and oversized frames, wrong fd
counts, peers that die mid-message, well-framed payloads with hostile msgpack inside (any
bytes in strings, deep nesting) and fds that are no listener where listeners are expected.
The only acceptable outcomes are messages or our own exceptions, and the process holds
exactly as many fds afterwards as before. (The hand-off server and client against each
other's garbage: test_ipc_fuzz_handoff.py.)"""

import os
import socket
from array import array

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from sockherd.ipc import messages as m
from sockherd.ipc.channel import Channel
from sockherd.ipc.errors import IPCError, ListenerMismatch, MessageError
from sockherd.ipc.frames import FD_BATCH, Delivered, FrameDecoder
from sockherd.ipc.listeners import adopt, describe
from sockherd.ipc.nesting import first_too_deep

from ipc_fdcount import FD_KINDS, devnull_fds, open_fd_count, open_fd_of_kind
from ipc_msgpack import any_value, depth, message_tree, pack
from ipc_streams import stream

FUZZ = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


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


def take_queued(channel: Channel) -> None:
    """Take (and close) every complete message the channel has already received."""
    while True:
        try:
            received = channel.next_message()
        except MessageError:
            continue
        if received is None:
            return
        received.close_fds()


def receive_until_failed(channel: Channel) -> None:
    """Receive (closing what comes) until the channel fails, then take what it still had
    queued from before the failure: from there on it must hold no fd at all."""
    while True:
        try:
            channel.recv(timeout=10).close_fds()
        except MessageError:
            continue                          # framing intact: keep reading
        except IPCError:
            break                             # protocol error or peer gone
    while True:
        try:
            channel.recv(timeout=10).close_fds()
        except MessageError:
            continue
        except IPCError:
            return                            # at once: a failed channel waits for nothing


@FUZZ
@given(stream(), st.booleans(), st.booleans())
def test_receive_path_never_crashes_nor_leaks(chunks, too_many_fds, stops_reading_first):
    before = open_fd_count()
    raw, ours = socket.socketpair()
    channel = Channel(ours)
    try:
        # Everything is written before the peer "dies" (closes), often mid-frame. No reader
        # runs yet, so a stream larger than the socket buffer (deep payloads) is cut short
        # where the buffer is full: the peer just dies earlier.
        raw.setblocking(False)
        for i, (data, nfds) in enumerate(chunks):
            if too_many_fds and i == len(chunks) // 2:
                nfds = FD_BATCH + 1          # one batch too many: MSG_CTRUNC on our side
            fds = devnull_fds(nfds)
            try:
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))] if fds else []
                if raw.sendmsg([data], ancillary) < len(data):
                    break
            except BlockingIOError:
                break
            finally:
                for fd in fds:
                    os.close(fd)
        if stops_reading_first:
            # Our ACKs now fail with EPIPE, as for a peer dying between our read and write.
            raw.shutdown(socket.SHUT_RD)
            try:
                channel.read_available()
            except IPCError:
                # Failed: once the complete messages before the failure are taken, it
                # holds no fd (the peer can no longer finish a half-received one).
                take_queued(channel)
                assert open_fd_count() == before + 2
        raw.close()
        receive_until_failed(channel)
        # errors.py: every error comes after the fds of the bad input are closed.
        assert open_fd_count() == before + 1          # our socket, nothing else
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
    if offset is not None:                           # it points at a container header
        assert 0x80 <= payload[offset] <= 0x9f or 0xdc <= payload[offset] <= 0xdf


# -- fds that are no listener where listeners are expected -----------------------------------



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
