"""Frame streams for the fuzz tests: valid frames, hostile payloads in valid frames, bad
headers, fd counts that do not match, cut into chunks at random points. Imported as a
plain sibling module."""

import hypothesis.strategies as st

from sockherd.ipc import messages as m
from sockherd.ipc.frames import (FD_BATCH, HEADER, KIND_ACK, KIND_FDS, KIND_MSG, MAGIC,
                                 VERSION, encode_frames)

from ipc_msgpack import message_tree, pack

valid_message = st.sampled_from([
    m.Stop(), m.Ready(pid=1), m.Heartbeat(seq=1, sent_at=0.0), m.Drain(deadline=1.0),
    m.Error(message="x"), m.StatsReply(request_id=1, stats={"a": 1}),
    m.Assignment(generation=1, worker_index=0, config={}, app="a:b"),
    # The hand-off conversation, so that garbage is sometimes a protocol step too.
    m.HandoffRequest(pid=1), m.HandoffConfirm(names=["app"]), m.HandoffListeners([]),
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
    chunks = [(chunk, draw(counts)) for chunk in chunks]
    if draw(st.booleans()):
        # Half the streams open with the first batch of a large message, its fds rightly
        # attached, and often nothing after it (or less than the rest): the receiver is
        # left mid-message, waiting for a batch that never comes.
        payload = m.encode(draw(valid_message))
        nfds = FD_BATCH + draw(st.sampled_from([1, 5, FD_BATCH]))
        first = (HEADER.pack(MAGIC, VERSION, KIND_MSG, nfds, len(payload)) + payload, FD_BATCH)
        chunks = [first] + chunks[:draw(st.integers(0, len(chunks)))]
    return chunks
