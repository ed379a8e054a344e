#!/usr/bin/env python3
"""Loopback throughput and CPU per GiB: xftp get -p N against xftp serve,
in clear and under TLS (every data connection encrypted), against
globus-url-copy -p N with globus-gridftp-server (clear), curl --ssl-reqd
and lftp with ftp:ssl-force/ssl-protect-data (TLS, one stream), and iperf3
memory to memory (-P N) as the ceiling of the sockets, on the same file in
the same run.

    bench/loopback.py [--size-mib 1024] [--streams 1,4,16] [--repeat 3] [--no-tls]

Writes bench/out/loopback/{results.csv,report.md}. CPU is user+system
seconds of client and server together (the GridFTP server forks a child per
session; its time reaches the parent's cutime/cstime when reaped), divided
by the GiB moved. Every transfer is checked with cmp against the source.
"""
import argparse, csv, hashlib, json, os, platform, re, shutil, signal, statistics
import subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out", "loopback")
XFTP = os.environ.get("XFTP", os.path.join(ROOT, "target", "release", "xftp"))
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """user+system (+ reaped children) seconds of a running process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[11..14] = utime stime cutime cstime (stat fields 14-17)
    return sum(int(x) for x in fields[11:15]) / TICK


def peak_rss_kib(pid):
    """VmHWM (peak resident set) of a running process, KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


TIME = "/usr/bin/time" if os.path.exists("/usr/bin/time") else None


def run_timed(argv, **kw):
    """Run argv; return (wall seconds, cpu seconds, stdout, peak RSS KiB).

    Peak RSS comes from GNU time (%M): the rusage of a child forked from
    Python would report Python's own size from before exec. 0 if GNU time
    is missing (apt-get install time)."""
    rss_file = tempfile.NamedTemporaryFile(delete=False)
    rss_file.close()
    if TIME:
        argv = [TIME, "-f", "%M", "-o", rss_file.name] + argv
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    out = p.stdout.read().decode(errors="replace")
    err = p.stderr.read().decode(errors="replace")
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): {err.strip()[-2000:]}")
    try:
        rss = int(open(rss_file.name).read().strip().splitlines()[-1])
    except (ValueError, IndexError):
        rss = 0
    os.unlink(rss_file.name)
    return wall, ru.ru_utime + ru.ru_stime, out, rss


def same(a, b):
    return subprocess.run(["cmp", "-s", a, b]).returncode == 0


def start_server(argv, ready_re, logf):
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=logf, text=True)
    line = p.stdout.readline() if ready_re else ""
    if ready_re and not re.search(ready_re, line):
        p.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return p, line


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--no-tls", action="store_true", help="skip the TLS rows")
    a = ap.parse_args()
    streams = [int(x) for x in a.streams.split(",")]
    if not a.no_build:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "xftp"], cwd=ROOT, check=True)
    os.makedirs(OUT, exist_ok=True)
    have_gridftp = shutil.which("globus-gridftp-server") and shutil.which("globus-url-copy")
    if not have_gridftp:
        print("bench: globus-gridftp-server/globus-url-copy missing: GridFTP rows skipped "
              "(apt-get install globus-gridftp-server-progs globus-gass-copy-progs)", file=sys.stderr)
    work = tempfile.mkdtemp(prefix="xftp-loopback-")
    os.chmod(work, 0o755)
    src = os.path.join(work, "src.bin")
    with open(src, "wb") as f:
        chunk = os.urandom(1 << 20)
        for i in range(a.size_mib):
            f.write(hashlib.sha256(chunk + i.to_bytes(8, "little")).digest() * (1 << 15))
    os.chmod(src, 0o644)
    size = os.path.getsize(src)
    rows, commands = [], []
    logf = open(os.path.join(OUT, "servers.log"), "w")
    try:
        def xftp_rows(tool, extra_srv, scheme, extra_cli):
            srv_cmd = [XFTP, "serve", "--root", work, "--listen", "127.0.0.1:0", "--anonymous-write"] + extra_srv
            srv, line = start_server(srv_cmd, r"listening on", logf)
            port = int(line.strip().rsplit(":", 1)[1])
            commands.append(" ".join(srv_cmd))
            try:
                for n in streams:
                    for r in range(a.repeat):
                        dst = os.path.join(work, "dst.bin")
                        argv = [XFTP, "get", f"{scheme}://localhost:{port}/src.bin", dst, "-p", str(n),
                                "--json"] + extra_cli
                        c0 = proc_cpu(srv.pid)
                        wall, ccpu, out, crss = run_timed(argv)
                        scpu = proc_cpu(srv.pid) - c0
                        srss = peak_rss_kib(srv.pid)
                        js = json.loads(out.strip().splitlines()[-1])
                        ok = js.get("status") == "ok" and same(src, dst)
                        if extra_cli:
                            ok = ok and js.get("tls") is True
                        rows.append(dict(tool=tool, streams=n, run=r, bytes=size, seconds=wall,
                                         mbit_s=size * 8 / wall / 1e6, client_cpu=ccpu, server_cpu=scpu,
                                         cpu_s_per_gib=(ccpu + scpu) / (size / 2**30), verified=ok,
                                         streams_used=js.get("streams"), client_peak_rss_kib=crss,
                                         server_peak_rss_kib=srss))
                        if r == 0:
                            commands.append(" ".join(argv))
                        os.unlink(dst)
            finally:
                srv.terminate()
                srv.wait()
            return port

        xftp_rows("xftp", [], "ftp", [])
        tls = not a.no_tls and shutil.which("openssl")
        if tls:
            cert, key = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                            "-nodes", "-days", "2", "-subj", "/CN=localhost", "-addext",
                            "subjectAltName=DNS:localhost", "-keyout", key, "-out", cert],
                           check=True, capture_output=True)
            tls_srv = ["--tls-cert", cert, "--tls-key", key, "--tls", "required"]
            xftp_rows("xftp TLS", tls_srv, "ftpes", ["--cacert", cert])
            # One-stream TLS baselines against xftp serve: curl and lftp.
            srv_cmd = [XFTP, "serve", "--root", work, "--listen", "127.0.0.1:0", "--anonymous"] + tls_srv
            srv, line = start_server(srv_cmd, r"listening on", logf)
            port = int(line.strip().rsplit(":", 1)[1])
            try:
                dst = os.path.join(work, "dst.bin")
                clients = []
                if shutil.which("curl"):
                    clients.append(("curl TLS", ["curl", "-s", "--ssl-reqd", "--cacert", cert, "-o", dst,
                                                 f"ftp://localhost:{port}/src.bin"]))
                if shutil.which("lftp"):
                    clients.append(("lftp TLS", ["lftp", "-c",
                                                 f"set ssl:ca-file {cert}; set ftp:ssl-force true; "
                                                 f"set ftp:ssl-protect-data true; set ftp:ssl-allow-anonymous true; "
                                                 f"open -p {port} localhost; get src.bin -o {dst}"]))
                for tool, argv in clients:
                    commands.append(" ".join(argv))
                    for r in range(a.repeat):
                        c0 = proc_cpu(srv.pid)
                        wall, ccpu, _, crss = run_timed(argv)
                        scpu = proc_cpu(srv.pid) - c0
                        ok = same(src, dst)
                        rows.append(dict(tool=tool, streams=1, run=r, bytes=size, seconds=wall,
                                         mbit_s=size * 8 / wall / 1e6, client_cpu=ccpu, server_cpu=scpu,
                                         cpu_s_per_gib=(ccpu + scpu) / (size / 2**30), verified=ok,
                                         streams_used=1, client_peak_rss_kib=crss, server_peak_rss_kib=0))
                        os.unlink(dst)
            finally:
                srv.terminate()
                srv.wait()
        # The ceiling: iperf3 memory to memory, the same byte count.
        if shutil.which("iperf3"):
            for n in streams:
                for r in range(a.repeat):
                    iport = 40000 + (os.getpid() + n + r) % 20000
                    isrv = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(iport)], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
                    time.sleep(0.3)
                    argv = ["iperf3", "-c", "127.0.0.1", "-p", str(iport), "-n", str(size), "-P", str(n), "-J"]
                    try:
                        c0 = proc_cpu(isrv.pid)
                        wall, ccpu, out, crss = run_timed(argv)
                        scpu = proc_cpu(isrv.pid) - c0
                        js = json.loads(out)
                        bps = js["end"]["sum_received"]["bits_per_second"]
                        rows.append(dict(tool="iperf3 (memory)", streams=n, run=r, bytes=size,
                                         seconds=size * 8 / bps, mbit_s=bps / 1e6, client_cpu=ccpu,
                                         server_cpu=scpu, cpu_s_per_gib=(ccpu + scpu) / (size / 2**30),
                                         verified=True, streams_used=n, client_peak_rss_kib=crss,
                                         server_peak_rss_kib=0))
                        if r == 0:
                            commands.append(" ".join(argv))
                    finally:
                        isrv.wait(timeout=30)
        if have_gridftp:
            gport = 50000 + os.getpid() % 10000
            gcmd = ["globus-gridftp-server", "-aa", "-anonymous-user", "nobody", "-hostname", "127.0.0.1",
                    "-p", str(gport), "-d", "error", "-l", os.path.join(OUT, "gridftp.log"),
                    "-disable-usage-stats"]
            gsrv = subprocess.Popen(gcmd, stdout=logf, stderr=logf)
            commands.append(" ".join(gcmd))
            time.sleep(1.0)
            try:
                for n in streams:
                    for r in range(a.repeat):
                        dst = os.path.join(work, "gdst.bin")
                        argv = ["globus-url-copy", "-p", str(n), f"ftp://127.0.0.1:{gport}{src}", f"file://{dst}"]
                        c0 = proc_cpu(gsrv.pid)
                        wall, ccpu, _, crss = run_timed(argv)
                        time.sleep(0.2)  # let the server reap its session child
                        scpu = proc_cpu(gsrv.pid) - c0
                        ok = same(src, dst)
                        rows.append(dict(tool="globus-url-copy", streams=n, run=r, bytes=size, seconds=wall,
                                         mbit_s=size * 8 / wall / 1e6, client_cpu=ccpu, server_cpu=scpu,
                                         cpu_s_per_gib=(ccpu + scpu) / (size / 2**30), verified=ok,
                                         streams_used=n, client_peak_rss_kib=crss,
                                         server_peak_rss_kib=0))
                        if r == 0:
                            commands.append(" ".join(argv))
                        os.unlink(dst)
            finally:
                gsrv.terminate()
                gsrv.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(OUT, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    lines = ["# Loopback: xftp (clear and TLS) vs GridFTP, curl, lftp, iperf3", "",
             f"File {size} bytes, {a.repeat} runs each, median shown. Machine: {platform.node()}, "
             f"{os.cpu_count()} CPUs, kernel {platform.release()}, congestion control "
             f"{open('/proc/sys/net/ipv4/tcp_congestion_control').read().strip()}.", "",
             "| tool | N | Mbit/s (median) | CPU s/GiB (client+server, median) | client peak RSS MiB | verified |",
             "|---|---|---|---|---|---|"]
    bad = False
    for tool in ["xftp", "globus-url-copy", "xftp TLS", "curl TLS", "lftp TLS", "iperf3 (memory)"]:
        for n in streams:
            rs = [r for r in rows if r["tool"] == tool and r["streams"] == n]
            if not rs:
                continue
            v = all(r["verified"] for r in rs)
            bad |= not v
            lines.append(f"| {tool} | {n} | {statistics.median(r['mbit_s'] for r in rs):.0f} | "
                         f"{statistics.median(r['cpu_s_per_gib'] for r in rs):.3f} | "
                         f"{max(r['client_peak_rss_kib'] for r in rs) / 1024:.1f} | {'yes' if v else 'NO'} |")
    srv_rss = max((r["server_peak_rss_kib"] for r in rows if r["tool"].startswith("xftp")), default=0)
    lines += ["", f"xftp server peak RSS over all its runs: {srv_rss / 1024:.1f} MiB "
              "(the GridFTP server forks a child per session, not measured).",
              "", "Commands (first run of each):", "", "```"] + commands + ["```", "",
              "Rerun: `bench/loopback.py` (options: --size-mib, --streams, --repeat, --no-tls).",
              "iperf3 wall time and CPU include its own start and control exchange; its Mbit/s is "
              "its receiver's figure."]
    with open(os.path.join(OUT, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if bad:
        print("bench: FAIL: a transfer did not verify", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
