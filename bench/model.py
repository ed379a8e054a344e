"""Throughput models the plots overlay on the measurements.

window_model: N connections each limited to W bytes per RTT, together
capped by the link: min(N * W * 8 / RTT, rate).

slow_start_model: the same for a file of `size` bytes split evenly over N
connections that start in slow start (initial window `iw` segments of
`mss` bytes, doubling each RTT up to W), plus one RTT to open the
connections. Losses are not modelled: where a measurement falls below
this line, something the model leaves out (queue overflow, timeouts) is
at work.
"""


def window_model(n, window, rtt, rate):
    """Aggregate bit/s of n window-limited connections on a link of rate bit/s."""
    return min(n * window * 8.0 / rtt, rate)


def slow_start_model(size, n, window, rtt, rate, mss=1448, iw=10, setup_rtts=1):
    """Average bit/s moving `size` bytes over n connections, with slow start."""
    per_conn = size / n
    per_rtt_cap = rate * rtt / 8.0 / n  # each connection's share of the pipe
    cwnd = iw * mss
    sent = 0.0
    rounds = 0
    while sent < per_conn:
        sent += min(cwnd, window, per_rtt_cap, per_conn - sent)
        rounds += 1
        cwnd *= 2
    seconds = (rounds + setup_rtts) * rtt
    # The link cannot deliver faster than its rate either way.
    seconds = max(seconds, size * 8.0 / rate + setup_rtts * rtt)
    return size * 8.0 / seconds


def mathis_model(n, rtt, loss, rate, mss=1448):
    """Aggregate bit/s of n loss-limited Reno-like connections (Mathis et al.:
    MSS/RTT * 1.22/sqrt(p) each), capped by the link. BBR does not follow it."""
    return min(n * mss * 8.0 / rtt * 1.22 / loss ** 0.5, rate)


if __name__ == "__main__":
    # Sanity check against hand numbers: 64 KiB windows at 100 ms RTT.
    w = 65535
    assert abs(window_model(1, w, 0.1, 100e6) - 5.2428e6) < 1e3
    assert window_model(100, w, 0.1, 100e6) == 100e6
    # A large file approaches the window model.
    big = slow_start_model(10**9, 1, w, 0.1, 100e6)
    assert 0.99 * window_model(1, w, 0.1, 100e6) < big <= window_model(1, w, 0.1, 100e6)
    print("model ok")
