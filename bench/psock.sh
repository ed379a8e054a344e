#!/bin/sh
# Loopback throughput of the parallel-sockets stream against one TcpStream.
# Usage: bench/psock.sh [BYTES] [REPEATS]   (default 4 GiB, 3 runs each)
# Prints one JSON line per run (record, mode, streams, bytes, seconds, gbit_s).
# Both ends run in one process on loopback; congestion control is the
# kernel default (see /proc/sys/net/ipv4/tcp_congestion_control).
set -eu
cd "$(dirname "$0")/.."
BYTES=${1:-4294967296}
REPEATS=${2:-3}
cargo build --quiet --release -p xftp-psock --example psbench
BIN=target/release/examples/psbench
echo "# cc=$(cat /proc/sys/net/ipv4/tcp_congestion_control) cores=$(nproc)" >&2
i=0
while [ "$i" -lt "$REPEATS" ]; do
    "$BIN" tcp "$BYTES"
    # "auto" is the library default (1 MiB records on one connection,
    # 128 KiB on more); 1 MiB on every N for comparison.
    for rs in auto 1048576; do
        for n in 1 4 16 128; do
            if [ "$rs" = auto ]; then
                "$BIN" psock "$n" "$BYTES" | sed 's/^{/{"record":"auto",/'
            else
                PSBENCH_RECORD=$rs "$BIN" psock "$n" "$BYTES" | sed "s/^{/{\"record\":$rs,/"
            fi
        done
    done
    i=$((i + 1))
done
