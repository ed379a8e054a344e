#!/usr/bin/env python3
"""Loopback data path: xftp against GridFTP, curl, lftp and iperf3.

One file downloaded over loopback by

  * `xftp get -p N` from `xftp serve`, in clear and under TLS (every data
    connection encrypted), in clear with sendfile(2) off
    (`XFTP_ZEROCOPY=off` on the server, N > 1: what zero copy saves), and
    in clear with splice(2) off (`XFTP_ZEROCOPY=off` on the client: what
    receiving through a pipe saves),
  * `globus-url-copy -p N` from `globus-gridftp-server` (clear),
  * curl `--ssl-reqd` and lftp (`ftp:ssl-force`, `ssl-protect-data`) from
    `xftp serve` (TLS, one stream),
  * and iperf3 `-P N` memory to memory, the ceiling of the sockets,

for each N and each storage, runs interleaved (round r runs every
configuration once before round r+1 starts, so a slow minute of the
machine does not fall on one tool), every copy checked against the source.

Storage:
  shm   source and destination in /dev/shm (tmpfs: the file in the page
        cache, written to memory);
  disk  source and destination on the filesystem of --disk-dir (default
        the system temporary directory); before each run the source's
        pages are dropped from the page cache (posix_fadvise DONTNEED), so
        it is read from the disk; a run ends when the copy is on the disk
        (xftp syncs its copy before it renames it into place; for the
        other tools the benchmark calls fsync on the copy, inside the
        timed window).

Before every run the page cache is synced, so no run pays for the
writeback of the one before. On a VM that returns freed memory to its
host at once (free page reporting), the reporting is delayed while the
benchmark runs (as root; restored at the end; see hold_freed_memory).

    bench/loopback.py [--size-mib 1024] [--streams 1,4,16] [--repeat 5]
                      [--storage shm,disk] [--no-tls] [--no-build]

Reports, per configuration: the median rate with the range of all runs
(Mbit/s of payload, wall clock of the client process, process start and
login included), CPU seconds per GiB twice: user + system of client and
server (the GridFTP server forks a child per session, whose time reaches
the parent's only when reaped), and the busy time of the whole machine
(/proc/stat: every process, kernel threads and softirq work; the fair
figure, on an otherwise idle machine, and the one the goals are judged
by), the cores each process kept busy (CPU seconds per wall-clock
second: above 1 it ran on several cores at once), peak RSS of the client (GNU time) and of the
xftp server (VmHWM, reset before each run through /proc/PID/clear_refs).
Writes bench/out/loopback/{results.csv,report.md}.
"""
import argparse, csv, json, os, platform, re, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out", "loopback")
XFTP = os.environ.get("XFTP", os.path.join(ROOT, "target", "release", "xftp"))
TICK = os.sysconf("SC_CLK_TCK")
TIME = "/usr/bin/time" if os.path.exists("/usr/bin/time") else None


def proc_cpu(pid):
    """user+system (+ reaped children) seconds of a running process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK


def peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def reset_peak(pid):
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def run_timed(argv, timeout=600):
    """Run argv; return (wall s, stdout, peak RSS KiB). Its CPU time is
    read with children_cpu() around the call."""
    rss_file = tempfile.NamedTemporaryFile(delete=False)
    rss_file.close()
    if TIME:
        argv = [TIME, "-f", "%M", "-o", rss_file.name] + argv
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    wall = time.perf_counter() - t0
    try:
        rss = int(open(rss_file.name).read().strip().splitlines()[-1])
    except (ValueError, IndexError, OSError):
        rss = 0
    os.unlink(rss_file.name)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): "
                           f"{err.decode(errors='replace').strip()[-2000:]}")
    return wall, out.decode(errors="replace"), rss


def children_cpu():
    r = os.times()
    return r.children_user + r.children_system


def machine_cpu():
    """Busy CPU seconds of the whole machine (every process, kernel threads
    and softirq work included): /proc/stat's first line minus idle and
    iowait."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / TICK


def same(a, b):
    return subprocess.run(["cmp", "-s", a, b]).returncode == 0


def settle():
    """Start every run with earlier runs' written copies flushed: their
    writeback would otherwise land in the next run's time."""
    os.sync()


REPORTING = "/sys/module/page_reporting/parameters/min_free_ms"


def hold_freed_memory():
    """On a VM with free page reporting (virtio-balloon), memory the guest
    frees goes back to the host at once, and the next touch of such a page
    faults into the host: every run that writes a fresh 1 GiB copy then
    pays for a million host faults or not, depending on which pages it got
    (CPU per GiB of the same binary varied 2x from run to run on the
    project's VM). As root, delay the reporting for the benchmark's length
    (restored at the end). Returns the old value, or None."""
    try:
        old = open(REPORTING).read().strip()
        with open(REPORTING, "w") as f:
            f.write("300000")  # the most the parameter takes: 5 minutes
        return old
    except OSError:
        return None


def restore_reporting(old):
    if old is not None:
        try:
            with open(REPORTING, "w") as f:
                f.write(old)
        except OSError:
            pass


def drop_cache(path):
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except OSError:
        pass


def start_server(argv, logf, env=None):
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=logf, text=True, env=env)
    line = p.stdout.readline()
    m = re.search(r"listening on .*:(\d+)\s*$", line)
    if not m:
        p.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return p, int(m.group(1))


def stop(p):
    p.terminate()
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def fmt_range(xs):
    return f"{min(xs):.0f}–{max(xs):.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--storage", default="shm,disk")
    ap.add_argument("--disk-dir", default=tempfile.gettempdir())
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--no-tls", action="store_true", help="skip the TLS rows")
    ap.add_argument("--tools", default="xftp,xftp-nozc,xftp-nosplice,xftp-tls,globus,curl,lftp,iperf3",
                    help="comma-separated subset (xftp-nozc: xftp with sendfile(2) off on the server, "
                         "N > 1; xftp-nosplice: xftp with splice(2) off on the client)")
    a = ap.parse_args()
    streams = [int(x) for x in a.streams.split(",")]
    tools = set(a.tools.split(","))
    if a.no_tls:
        tools -= {"xftp-tls", "curl", "lftp"}
    if not a.no_build:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "xftp"], cwd=ROOT, check=True)
    os.makedirs(OUT, exist_ok=True)
    if not (shutil.which("globus-gridftp-server") and shutil.which("globus-url-copy")):
        print("bench: globus-gridftp-server/globus-url-copy missing: GridFTP rows skipped "
              "(apt-get install globus-gridftp-server-progs globus-gass-copy-progs)", file=sys.stderr)
        tools.discard("globus")
    for t, prog in [("curl", "curl"), ("lftp", "lftp"), ("iperf3", "iperf3")]:
        if t in tools and not shutil.which(prog):
            print(f"bench: {prog} missing: its rows skipped", file=sys.stderr)
            tools.discard(t)
    if not shutil.which("openssl"):
        tools -= {"xftp-tls", "curl", "lftp"}

    rows, commands = [], {}
    logf = open(os.path.join(OUT, "servers.log"), "w")
    reporting = hold_freed_memory()
    dirs = []
    servers = []
    try:
        # One directory per storage, readable by the GridFTP server's
        # anonymous user (nobody).
        works = {}
        for st in a.storage.split(","):
            base = "/dev/shm" if st == "shm" else a.disk_dir
            w = tempfile.mkdtemp(prefix="xftp-loopback-", dir=base)
            os.chmod(w, 0o777)
            dirs.append(w)
            src = os.path.join(w, "src.bin")
            with open(src, "wb") as f:
                chunk = os.urandom(1 << 20)
                for i in range(a.size_mib):
                    f.write(chunk[i % 97:] + chunk[:i % 97])
            os.chmod(src, 0o644)
            works[st] = (w, src)
        size = a.size_mib << 20
        cert = key = None
        if tools & {"xftp-tls", "curl", "lftp"}:
            cert, key = os.path.join(dirs[0], "cert.pem"), os.path.join(dirs[0], "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                            "-nodes", "-days", "2", "-subj", "/CN=localhost", "-addext",
                            "subjectAltName=DNS:localhost", "-keyout", key, "-out", cert],
                           check=True, capture_output=True)
        # Servers: one xftp (plain), one xftp (TLS required) and one GridFTP
        # server, each serving /, so every storage's files are reachable;
        # read-only (every transfer here is a download), so that no local
        # user can write through them while the benchmark runs.
        srv = {}
        if tools & {"xftp"}:
            argv = [XFTP, "serve", "--root", "/", "--listen", "127.0.0.1:0", "--anonymous"]
            p, port = start_server(argv, logf)
            servers.append(p)
            srv["xftp"] = (p, port)
            commands["xftp serve"] = " ".join(argv)
        if "xftp-nozc" in tools:
            # The same server with sendfile(2) off: what zero copy saves.
            argv = [XFTP, "serve", "--root", "/", "--listen", "127.0.0.1:0", "--anonymous"]
            p, port = start_server(argv, logf, env=dict(os.environ, XFTP_ZEROCOPY="off"))
            servers.append(p)
            srv["nozc"] = (p, port)
            commands["xftp serve (no sendfile)"] = "XFTP_ZEROCOPY=off " + " ".join(argv)
        if tools & {"xftp-tls", "curl", "lftp"}:
            argv = [XFTP, "serve", "--root", "/", "--listen", "127.0.0.1:0", "--anonymous",
                    "--tls-cert", cert, "--tls-key", key, "--tls", "required"]
            p, port = start_server(argv, logf)
            servers.append(p)
            srv["tls"] = (p, port)
            commands["xftp serve (TLS)"] = " ".join(argv)
        if "globus" in tools:
            gport = 50000 + os.getpid() % 10000
            argv = ["globus-gridftp-server", "-aa", "-anonymous-user", "nobody", "-hostname", "127.0.0.1",
                    "-p", str(gport), "-d", "error", "-l", os.path.join(OUT, "gridftp.log"),
                    "-disable-usage-stats"]
            p = subprocess.Popen(argv, stdout=logf, stderr=logf)
            servers.append(p)
            srv["globus"] = (p, gport)
            commands["globus-gridftp-server"] = " ".join(argv)
            time.sleep(1.0)

        def configs(st):
            w, src = works[st]
            dst = os.path.join(w, "dst.bin")
            for n in streams:
                if "xftp" in tools:
                    p, port = srv["xftp"]
                    yield ("xftp", n, p, [XFTP, "get", f"ftp://127.0.0.1:{port}{src}", dst, "-p", str(n),
                                          "--json"], dst)
                if "xftp-nozc" in tools and n > 1:
                    p, port = srv["nozc"]
                    yield ("xftp, no sendfile", n, p, [XFTP, "get", f"ftp://127.0.0.1:{port}{src}", dst,
                                                       "-p", str(n), "--json"], dst)
                if "xftp-nosplice" in tools:
                    # The client receiving through a buffer: what splice saves.
                    p, port = srv["xftp"]
                    yield ("xftp, no splice", n, p, ["env", "XFTP_ZEROCOPY=off", XFTP, "get",
                                                     f"ftp://127.0.0.1:{port}{src}", dst, "-p", str(n),
                                                     "--json"], dst)
                if "xftp-tls" in tools:
                    p, port = srv["tls"]
                    yield ("xftp TLS", n, p, [XFTP, "get", f"ftpes://localhost:{port}{src}", dst, "-p",
                                              str(n), "--json", "--cacert", cert], dst)
                if "globus" in tools:
                    p, port = srv["globus"]
                    yield ("globus-url-copy", n, p, ["globus-url-copy", "-p", str(n),
                                                     f"ftp://127.0.0.1:{port}{src}", f"file://{dst}"], dst)
                if "iperf3" in tools:
                    yield ("iperf3 (memory)", n, None, ["iperf3", "-c", "127.0.0.1", "-n", str(size),
                                                        "-P", str(n), "-J"], None)
            if "curl" in tools:
                p, port = srv["tls"]
                yield ("curl TLS", 1, p, ["curl", "-s", "--ssl-reqd", "--cacert", cert, "-o", dst,
                                          f"ftp://localhost:{port}{src}"], dst)
            if "lftp" in tools:
                p, port = srv["tls"]
                yield ("lftp TLS", 1, p, ["lftp", "-c",
                                          f"set ssl:ca-file {cert}; set ftp:ssl-force true; "
                                          f"set ftp:ssl-protect-data true; set ftp:ssl-allow-anonymous true; "
                                          f"open -p {port} localhost; get {src} -o {dst}"], dst)

        for r in range(a.repeat):
            for st in works:
                w, src = works[st]
                for tool, n, server, argv, dst in configs(st):
                    settle()
                    if st == "disk":
                        drop_cache(src)
                    if tool.startswith("iperf3"):
                        iport = 40000 + (os.getpid() + n + r) % 20000
                        argv = argv[:3] + ["-p", str(iport)] + argv[3:]
                        server = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(iport)],
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        time.sleep(0.3)
                    c0 = proc_cpu(server.pid) if server else 0.0
                    if server is not None and (tool.startswith("xftp") or tool.endswith("TLS")):
                        reset_peak(server.pid)
                    k0, m0 = children_cpu(), machine_cpu()
                    wall, out, crss = run_timed(argv)
                    if st == "disk" and dst:
                        # Until the copy is on the disk, for every tool
                        # alike: xftp syncs its copy before renaming it
                        # into place, the others leave that to the kernel.
                        t0 = time.perf_counter()
                        fd = os.open(dst, os.O_RDONLY)
                        os.fsync(fd)
                        os.close(fd)
                        wall += time.perf_counter() - t0
                    ccpu, mcpu = children_cpu() - k0, machine_cpu() - m0
                    if tool.startswith("globus"):
                        time.sleep(0.2)  # the server reaps its session child
                    scpu = proc_cpu(server.pid) - c0
                    srss = peak_rss_kib(server.pid) if not tool.startswith(("globus", "iperf3")) else 0
                    secs = wall
                    ok = True
                    if tool.startswith("iperf3"):
                        server.wait(timeout=30)
                        js = json.loads(out)
                        bps = js["end"]["sum_received"]["bits_per_second"]
                        secs = size * 8 / bps
                    else:
                        if tool.startswith("xftp"):
                            js = json.loads(out.strip().splitlines()[-1])
                            ok = js.get("status") == "ok" and (("TLS" not in tool) or js.get("tls") is True)
                        ok = ok and same(src, dst)
                        os.unlink(dst)
                    rows.append(dict(storage=st, tool=tool, streams=n, run=r, bytes=size, seconds=round(secs, 4),
                                     mbit_s=round(size * 8 / secs / 1e6), client_cpu=round(ccpu, 3),
                                     server_cpu=round(scpu, 3),
                                     cpu_s_per_gib=round((ccpu + scpu) / (size / 2**30), 3),
                                     machine_cpu_s_per_gib=round(mcpu / (size / 2**30), 3), verified=ok,
                                     client_peak_rss_kib=crss, server_peak_rss_kib=srss))
                    key_ = f"{tool} -p {n}"
                    commands.setdefault(key_, " ".join(argv))
                    print(f"{st} r{r} {tool} N={n}: {rows[-1]['mbit_s']} Mbit/s, "
                          f"{rows[-1]['cpu_s_per_gib']} CPU s/GiB{'' if ok else ' NOT VERIFIED'}",
                          file=sys.stderr, flush=True)
    finally:
        restore_reporting(reporting)
        for p in servers:
            stop(p)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    with open(os.path.join(OUT, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip()
    load = open("/proc/loadavg").read().split()[:3]
    lines = ["# Loopback: xftp (clear and TLS) against GridFTP, curl, lftp and iperf3", "",
             f"File of {size} bytes; {a.repeat} interleaved runs of each configuration; median "
             f"and range. Commit {rev}; machine {platform.node()}, {os.cpu_count()} CPUs, kernel "
             f"{platform.release()}, congestion control "
             f"{open('/proc/sys/net/ipv4/tcp_congestion_control').read().strip()}; load average "
             f"after the run {' '.join(load)}; free page reporting "
             f"{'held during the run' if reporting is not None else 'not present or not changed'}.", ""]
    order = ["xftp", "xftp, no sendfile", "xftp, no splice", "globus-url-copy", "xftp TLS", "curl TLS", "lftp TLS",
             "iperf3 (memory)"]
    med = {}
    bad = False
    for st in works:
        lines += [f"## storage: {st}", "",
                  "| tool | N | Mbit/s median | range | CPU s/GiB: client+server | whole machine | "
                  "cores busy: client, server | client peak RSS MiB | server peak RSS MiB | verified |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for tool in order:
            for n in streams:
                rs = [x for x in rows if x["storage"] == st and x["tool"] == tool and x["streams"] == n]
                if not rs:
                    continue
                v = all(x["verified"] for x in rs)
                bad |= not v
                m = statistics.median(x["mbit_s"] for x in rs)
                c = statistics.median(x["cpu_s_per_gib"] for x in rs)
                mc = statistics.median(x["machine_cpu_s_per_gib"] for x in rs)
                med[(st, tool, n)] = (m, mc)
                srss = max(x["server_peak_rss_kib"] for x in rs)
                srss = f"{srss / 1024:.1f}" if srss else "–"
                # CPU seconds per wall-clock second: above 1, a process
                # ran on more than one core at once (TLS on N streams).
                cc = statistics.median(x["client_cpu"] / x["seconds"] for x in rs)
                sc = statistics.median(x["server_cpu"] / x["seconds"] for x in rs)
                lines.append(f"| {tool} | {n} | {m:.0f} | {fmt_range([x['mbit_s'] for x in rs])} | {c:.2f} | "
                             f"{mc:.2f} | {cc:.2f}, {sc:.2f} | "
                             f"{max(x['client_peak_rss_kib'] for x in rs) / 1024:.1f} | {srss} | "
                             f"{'yes' if v else 'NO'} |")
        lines.append("")
        # The goals, stated against the medians.
        for n in streams:
            x, g = med.get((st, "xftp", n)), med.get((st, "globus-url-copy", n))
            if x and g:
                lines.append(f"* N = {n}: xftp / globus-url-copy = {x[0] / g[0]:.2f} in rate, "
                             f"{x[1] / g[1]:.2f} in CPU per GiB (whole machine)")
        x4, i4, t4 = med.get((st, "xftp", 4)), med.get((st, "iperf3 (memory)", 4)), med.get((st, "xftp TLS", 4))
        if x4 and i4:
            lines.append(f"* xftp N = 4 / iperf3 N = 4 = {x4[0] / i4[0]:.2f}")
        if x4 and t4:
            lines.append(f"* xftp TLS N = 4 / xftp N = 4 = {t4[0] / x4[0]:.2f}")
        lines.append("")
    lines += ["Commands (storage paths vary):", "", "```"] + [f"{k}: {v}" for k, v in commands.items()] + \
             ["```", "", "Rerun: `bench/loopback.py` (`--help` for the options). iperf3's rate is its "
              "receiver's own figure (it starts its clock after its connections are up); its CPU "
              "includes its start."]
    with open(os.path.join(OUT, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if bad:
        print("bench: FAIL: a transfer did not verify", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
