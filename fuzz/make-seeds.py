#!/usr/bin/env python3
"""Writes the committed seed corpus, fuzz/seeds/TARGET/seed-*: a few valid
inputs per fuzz target. Rerun after changing a wire format."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def block(desc, count, offset):
    return bytes([desc]) + struct.pack(">QQ", count, offset)


def hello(minv, maxv, session, index, count, record):
    return b"XPSK" + bytes([minv, maxv]) + session + struct.pack(">HHI", index, count, record) + b"\0\0"


def reply(status, version, record):
    return b"XPSK" + bytes([status, version, 0, 0]) + struct.pack(">I", record)


SEEDS = {
    "commands": [
        b"USER alice\r\nPASS secret\r\nTYPE I\r\n",
        b"MULT 4\r\nMPRT 127,0,0,1,4,1;127,0,0,1,4,2\r\nRETR file.bin\r\n",
        b"EPRT |2|::1|5000|\r\nPASV\r\nEPSV ALL\r\nSPAS\r\n",
        b"OPTS RETR Parallelism=4,4,4;\r\nMODE E\r\nERET P 0 1000 f\r\n",
        b"AUTH TLS\r\nPBSZ 0\r\nPROT P\r\nOPTS TLS BIND\r\nCCC\r\n",
        b"SITE WIN 1048576\r\nSITE BUFSIZE 4194304\r\nSBUF 65536\r\n",
        b"REST 100\r\nSTOR a\r\nAPPE b\r\nSIZE c\r\nMDTM d\r\nCKSM MD5 0 -1 f\r\n",
        b"LIST -la\r\nNLST\r\nMLSD /\r\nCWD ..\r\nMKD x\r\nRNFR a\r\nRNTO b\r\nQUIT\n",
    ],
    "replies": [
        b"\x05220 xftp ready\r\n331 Password required\r\n",
        b"\x10227 Entering Passive Mode (127,0,0,1,195,80)\r\n229 Entering Extended Passive Mode (|||50000|)\r\n",
        b"\x00211-Features:\r\n MULT\r\n MPRT\r\n SIZE\r\n211 End\r\n",
        b"\x03213 1048576\r\n226 Transfer complete\r\n550-no such file\r\n550 done\r\n",
        b"\x20150 Opening\r\n200 MULT 4\r\n234 AUTH TLS ok\r\n",
    ],
    "hostport": [
        b"127,0,0,1,4,1",
        b"|1|127.0.0.1|5000|",
        b"|2|::1|5000|",
        b"127,0,0,1,4,1;127,0,0,1,4,2;127,0,0,1,4,3",
        b"227 Entering Passive Mode (198,18,0,1,195,80)",
        b"229 Entering Extended Passive Mode (|||50000|)",
    ],
    "blocks": [
        block(0x00, 5, 0) + b"hello" + block(0x00, 3, 5) + b"abc",
        block(0x08, 0, 0),
        block(0x40, 0, 4),
        block(0x00, 4, 4096) + b"data" + block(0x08, 0, 0) + block(0x48, 0, 2),
    ],
    "reassembly": [
        # add two connections, data on each, EOD on each, EOF, payload stored.
        bytes([0, 0, 1, 0, 0, 0, 4, 1, 1, 0, 1, 4, 4, 4, 1, 0, 1, 0, 0, 1, 1, 1, 0, 0, 1, 0, 2, 2, 0, 5]),
        bytes([0, 1, 0, 0, 0, 8, 1, 0, 0, 2, 8, 4, 1, 0, 1, 0, 0, 1, 0, 2, 0, 1, 2, 0, 3, 0]),
        bytes([0, 0, 0, 1, 0, 3, 0, 0, 1, 2, 0, 0, 5]),
    ],
    "progress": [
        b"XFTP-PROGRESS bytes=1048576 conns=4 rtt_us=560000 min_rtt_us=550000 retrans=3 segs_out=800 delivered=797 t_us=1500000",
        b"XFTP-PROGRESS bytes=0 conns=0 rtt_us=0 min_rtt_us=0 retrans=0 segs_out=0 delivered=0 t_us=0",
        b"  XFTP-PROGRESS bytes=18446744073709551615 conns=16\r\n",
    ],
    "handshake": [
        hello(1, 1, bytes(range(16)), 0, 4, 65536),
        hello(1, 1, b"\xab" * 16, 3, 4, 1 << 20),
        hello(2, 9, b"\x00" * 16, 1023, 1024, 4096),
        reply(0, 1, 65536),
        reply(1, 1, 0),
        reply(7, 1, 1 << 20),
    ],
}

for target, seeds in SEEDS.items():
    d = os.path.join(HERE, "seeds", target)
    os.makedirs(d, exist_ok=True)
    # Numbered seeds are rewritten; others (inputs a fuzzer once crashed
    # on, kept as regressions) stay.
    for old in os.listdir(d):
        if old.startswith("seed-") and old[5:].isdigit():
            os.remove(os.path.join(d, old))
    for i, s in enumerate(seeds):
        with open(os.path.join(d, f"seed-{i}"), "wb") as f:
            f.write(s)
    print(f"{target}: {len(seeds)} seeds")
