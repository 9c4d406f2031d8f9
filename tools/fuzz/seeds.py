#!/usr/bin/env python3
"""Writes the seed corpus of each fuzz target to tools/fuzz/corpus/<target>/ (checked in).

Seeds are well-formed inputs the fuzzer mutates from: every frame type, metadata, handshakes with
and without a token, and length-prefixed streams. Rerun after a protocol change:
    python3 tools/fuzz/seeds.py
"""
import hashlib
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def frame(ftype, payload=b"", metadata=b"", method=0, call=1, timeout=0, status=0, flags=0):
    head = struct.pack("<BBBBIQQII", 0xA7, 1, ftype, flags, method, call, timeout, status,
                       len(metadata))
    return head + metadata + payload


def metadata(pairs):
    out = b""
    for k, v in pairs:
        out += struct.pack("<HI", len(k), len(v)) + k + v
    return out


def hello(token=None, addr=0, rkey=0, ring=0):
    flags = 1 if token is not None else 0
    body = struct.pack("<IHHQII", 0x31435052, 2, flags, addr, rkey, ring)
    return body + (token if token is not None else bytes(32))


def answer(code):
    return struct.pack("<IHH", 0x31435052, 2, code)


def stream(messages):
    return b"".join(struct.pack("<I", len(m)) + m for m in messages)


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    md = metadata([(b"trace-id", b"abc123"), (b"k", b""), (b"bin", b"\x00\xff")])
    write("frame", "request", frame(1, b"\x0a\x05hello", method=0x1234ABCD, timeout=500000))
    write("frame", "request_metadata", frame(1, b"\x08\x01", md, method=7, call=2))
    write("frame", "response_ok", frame(2, b"\x0a\x02hi", call=3))
    write("frame", "response_error", frame(2, b"no such key", call=4, status=5))
    write("frame", "cancel", frame(3, call=5))
    write("frame", "ping", frame(4, call=6))
    write("frame", "pong", frame(5, call=6))
    write("frame", "goaway", frame(6, b"server is shutting down", call=0, status=14))
    write("frame", "settings", frame(7, struct.pack("<II", 1024, 0), call=0))
    write("frame", "truncated", frame(1, b"x")[:20])

    token = hashlib.sha256(b"fuzz secret").digest()
    write("handshake", "hello_tcp", hello())
    write("handshake", "hello_token", hello(token))
    write("handshake", "hello_rdma", hello(token, addr=0x7F0012340000, rkey=0x1234, ring=1 << 20))
    write("handshake", "hello_v1", struct.pack("<IHH", 0x31435052, 1, 0) + bytes(48))
    for code in range(4):
        write("handshake", "answer_%d" % code, answer(code))

    # Reassembler inputs: byte 0 seeds the read sizes, byte 1 sets the limit (1 + 4*b).
    write("reassembler", "small_messages", b"\x07\x40" + stream([b"a", b"", b"hello", b"x" * 60]))
    write("reassembler", "one_big", b"\x03\xff" + stream([bytes(range(256)) * 3]))
    write("reassembler", "too_large", b"\x05\x02" + stream([b"ok", b"x" * 100]))
    write("reassembler", "partial_tail", b"\x09\x40" + stream([b"abc", b"def"])[:-2])


if __name__ == "__main__":
    main()
