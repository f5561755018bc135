"""The frame codec decision of issue 23, measured: how fast client frames
(masked, as clients must send them) are parsed into messages by the
native codec (worker/native/proto/ws/ws_frame.c, through WsParser) and by the two
maintained Python codecs an ASGI server could use instead: wsproto's
FrameProtocol (uvicorn's --ws wsproto) and websockets' Frame.parse
(uvicorn's default --ws websockets), each with its text decoded as UTF-8;
ASCII text, text with accented letters ("mixed": the UTF-8 check's slow
bytes) and binary payloads.

    .venv/bin/python bench/ws_frame_bench.py [--frames N] [--size BYTES]

Prints messages/s per codec and the ratio to the native one; one process,
one thread, best of 5 runs. docs/websocket.md records a run."""
from __future__ import annotations

import argparse
import os
import struct
import time


KINDS = {
    # (opcode, payload of `size` bytes)
    "ascii": (0x1, lambda size: b"x" * size),
    "mixed": (0x1, lambda size: ("héllo wörld " * (size // 12 + 1)).encode()[:size]
              .decode("utf-8", "ignore").encode()),
    "binary": (0x2, lambda size: os.urandom(size)),
}


def client_frames(n: int, size: int, kind: str) -> bytes:
    op, make = KINDS[kind]
    text = make(size)
    key = os.urandom(4)
    masked = bytes(b ^ key[i & 3] for i, b in enumerate(text))
    if len(text) < 126:
        head = struct.pack("!BB", 0x80 | op, 0x80 | len(text))
    else:
        head = struct.pack("!BBH", 0x80 | op, 0x80 | 126, len(text))
    return (head + key + masked) * n


def chunks(data: bytes, step: int = 64 << 10):
    return [data[i:i + step] for i in range(0, len(data), step)]


def native(parts, n):
    from sockherd.worker._http import WsParser
    p = WsParser()
    got = 0
    for part in parts:
        got += len(p.feed(part))
    assert got == n, got


def wsproto_codec(parts, n):
    from wsproto.frame_protocol import FrameProtocol
    fp = FrameProtocol(client=False, extensions=[])
    got = 0
    for part in parts:
        fp.receive_bytes(part)
        for frame in fp.received_frames():
            got += frame.frame_finished    # a frame split across reads comes in parts
    assert got == n, got


def websockets_codec(parts, n):
    from websockets.frames import Frame
    from websockets.streams import StreamReader
    reader = StreamReader()
    got = 0
    gen = Frame.parse(reader.read_exact, mask=True)
    for part in parts:
        reader.feed_data(part)
        while True:
            try:
                next(gen)
                break                      # needs more bytes
            except StopIteration as stop:
                frame = stop.value
                if frame.opcode.value == 1:
                    frame.data.decode("utf-8")
                got += 1
                gen = Frame.parse(reader.read_exact, mask=True)
    assert got == n, got


def best(fn, parts, n, runs=5):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn(parts, n)
        times.append(time.perf_counter() - t)
    return n / min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()
    for kind in KINDS:
        parts = chunks(client_frames(args.frames, args.size, kind))
        rates = {"native (ws_frame.c)": best(native, parts, args.frames),
                 "wsproto FrameProtocol": best(wsproto_codec, parts, args.frames),
                 "websockets Frame.parse": best(websockets_codec, parts, args.frames)}
        base = rates["native (ws_frame.c)"]
        print(f"{args.frames} masked {kind} frames of {args.size} bytes, fed in 64 KiB reads")
        for name, rate in rates.items():
            print(f"  {name:24s} {rate:12,.0f} msg/s   {rate / base:6.3f}x native")


if __name__ == "__main__":
    main()
