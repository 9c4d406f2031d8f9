#!/usr/bin/env python3
"""Writes the seed corpus of each fuzz target to tools/fuzz/corpus/<target>/ (checked in).

Seeds are well-formed inputs the fuzzer mutates from: every frame type, metadata, handshakes with
and without authentication, and length-prefixed streams. Rerun after a protocol change:
    python3 tools/fuzz/seeds.py
"""
import hashlib
import hmac
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


def hello(wants_auth=False, proof=None, addr=0, rkey=0, ring=0, version=4):
    """A HELLO of handshake version 4: flags bit 0 = wants auth, bit 1 = challenge + proof."""
    flags = (1 if wants_auth else 0) | (2 if proof is not None else 0)
    body = struct.pack("<IHHQII", 0x31435052, version, flags, addr, rkey, ring)
    nonce = bytes(range(1, 9))
    if proof is None:
        return body + nonce + bytes(24)
    challenge, mac = proof
    return body + nonce + challenge + mac


def answer(code, challenge=bytes(8), proof=bytes(32)):
    return struct.pack("<IHH", 0x31435052, 3, code) + challenge + proof


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

    write("handshake", "hello_tcp", hello())
    write("handshake", "hello_wants_auth", hello(wants_auth=True))
    mac = hmac.new(b"fuzz secret", b"not a real proof", hashlib.sha256).digest()[:16]
    write("handshake", "hello_proof", hello(True, (bytes(range(8)), mac)))
    write("handshake", "hello_rdma", hello(True, (bytes(8), mac), 0x7F0012340000, 0x1234, 32 << 10))
    write("handshake", "hello_v2", hello(version=2))
    write("handshake", "hello_v3", hello(version=3))
    for code in range(6):
        write("handshake", "answer_%d" % code, answer(code, bytes(range(8)), bytes(range(32))))
    write("handshake", "answer_v2", struct.pack("<IHH", 0x31435052, 2, 2))

    # Reassembler inputs: byte 0 seeds the read sizes, byte 1 sets the limit (1 + 4*b).
    write("reassembler", "small_messages", b"\x07\x40" + stream([b"a", b"", b"hello", b"x" * 60]))
    write("reassembler", "one_big", b"\x03\xff" + stream([bytes(range(256)) * 3]))
    write("reassembler", "too_large", b"\x05\x02" + stream([b"ok", b"x" * 100]))
    write("reassembler", "partial_tail", b"\x09\x40" + stream([b"abc", b"def"])[:-2])

    # RDMA record inputs: byte 0 sets the limit (1 + 4*b), then [u8 length][record] each.
    write("record", "whole_messages", b"\x40" + records([rec(5, 0, b"hello"), rec(0, 0, b""),
                                                         rec(3, 0, b"abc")]))
    write("record", "chunked", b"\x40" + records([rec(10, 0, b"abcd"), rec(10, 0, b""),
                                                  rec(10, 0, b"efghij"), rec(2, 0, b"ok")]))
    write("record", "rendezvous", b"\xff" + records([
        rec(1000, 1, struct.pack("<QII", 0x7F0012340000, 0x1234, 2)), rec(1, 0, b"x")]))
    write("record", "bad_chunk", b"\x40" + records([rec(10, 0, b"abcd"), rec(11, 0, b"e")]))
    write("record", "over_limit", b"\x01" + records([rec(100, 0, b"x" * 100)]))


def rec(total, kind, body):
    """One record: the 8-byte header (total, kind) and its body."""
    return struct.pack("<II", total, kind) + body


def records(recs):
    return b"".join(bytes([len(r)]) + r for r in recs)


if __name__ == "__main__":
    main()
