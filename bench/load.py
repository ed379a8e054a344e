#!/usr/bin/env python3
"""Load test of `xftp serve` on loopback (nothing leaves the machine):
C concurrent clients (default 64), each moving verified files over N
streams (default 8), gets and puts mixed, for D seconds (default 120);
then I idle sessions (default 1000) and what each costs the server.

    bench/load.py [--clients 64] [--streams 8] [--seconds 120] [--idle 1000] [--mib 4] [--seed S]

Reports completed transfers, errors, aggregate throughput, the server's
peak RSS, its open descriptors before and after (a leak shows as a
difference), the p50/p99 time from the start of a client to its first
data command (connect, login, MULT and EPSV, by xftp's own clock:
total_seconds - seconds in its JSON summary), and the server's memory
per idle logged-in session. Writes bench/out/load/{results.json,report.md}.
The seed (printed) picks each client's sequence of gets and puts.
"""
import argparse, json, os, random, resource, socket, statistics
import subprocess, sys, tempfile, threading, time

from common import sha

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out", "load")
XFTP = os.environ.get("XFTP", os.path.join(ROOT, "target", "release", "xftp"))


def rss_kib(pid, field="VmRSS:"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--mib", type=int, default=4, help="size of each file")
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int(time.time())
    print(f"load: seed {seed} (--seed {seed} repeats the mix)", flush=True)
    if not os.path.exists(XFTP):
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "xftp"], cwd=ROOT, check=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    os.makedirs(OUT, exist_ok=True)
    work = tempfile.mkdtemp(prefix="xftp-load-")
    root = os.path.join(work, "root")
    os.makedirs(os.path.join(root, "up"))
    files = {}
    for i in range(8):
        p = os.path.join(root, f"f{i}.bin")
        with open(p, "wb") as f:
            f.write(os.urandom(a.mib << 20))
        files[f"f{i}.bin"] = sha(p)
    srv = subprocess.Popen(
        [XFTP, "serve", "--root", root, "--listen", "127.0.0.1:0", "--anonymous-write",
         "--max-sessions", str(a.clients + a.idle + 64),
         "--max-sessions-per-ip", str(a.clients + a.idle + 64),
         "--max-streams-per-ip", str(a.clients * a.streams * 2 + 64),
         "--max-streams", str(max(a.streams, 1))],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = srv.stdout.readline()
    port = int(line.strip().rsplit(":", 1)[1])
    base = f"ftp://127.0.0.1:{port}"
    time.sleep(0.3)
    fds_before, rss_before = fds(srv.pid), rss_kib(srv.pid)
    peak = [rss_before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], rss_kib(srv.pid))
            except OSError:
                return
            time.sleep(0.25)

    threading.Thread(target=sample, daemon=True).start()
    results = []
    lock = threading.Lock()
    deadline = time.time() + a.seconds

    def client(k):
        rng = random.Random(seed * 1000 + k)
        mine = os.path.join(work, f"c{k}")
        os.makedirs(mine)
        src = os.path.join(mine, "src.bin")
        with open(src, "wb") as f:
            f.write(rng.randbytes(a.mib << 20))
        src_sha = sha(src)
        n = 0
        while time.time() < deadline:
            n += 1
            if rng.random() < 0.5:
                name = rng.choice(list(files))
                dst = os.path.join(mine, "got.bin")
                argv = [XFTP, "get", "-p", str(a.streams), "--json", f"{base}/{name}", dst]
                want, check = files[name], dst
            else:
                name = f"up/c{k}-{n}.bin"
                argv = [XFTP, "put", "-p", str(a.streams), "--json", src, f"{base}/{name}"]
                want, check = src_sha, os.path.join(root, name)
            t0 = time.time()
            p = subprocess.run(argv, capture_output=True, text=True)
            wall = time.time() - t0
            rec = {"kind": argv[1], "ok": p.returncode == 0, "wall": wall}
            try:
                j = json.loads(p.stdout.strip().splitlines()[-1])
                rec["bytes"] = j.get("bytes", 0)
                rec["ttfd"] = j.get("total_seconds", 0) - j.get("seconds", 0)
            except (ValueError, IndexError):
                rec["ok"] = False
            if rec["ok"]:
                rec["ok"] = sha(check) == want
                if not rec["ok"]:
                    rec["why"] = "content differs"
                if argv[1] == "put":
                    os.remove(check)
            else:
                rec["why"] = (p.stderr.strip().splitlines() or ["?"])[-1][:200]
            with lock:
                results.append(rec)

    t_start = time.time()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.time() - t_start
    time.sleep(2)
    fds_after = fds(srv.pid)
    # Idle sessions: logged in, then nothing.
    idle_before = rss_kib(srv.pid)
    socks = []
    for _ in range(a.idle):
        s = socket.create_connection(("127.0.0.1", port))
        f = s.makefile("rb")
        f.readline()
        s.sendall(b"USER anonymous\r\n")
        f.readline()
        s.sendall(b"PASS x@y\r\n")
        f.readline()
        socks.append((s, f))
    time.sleep(1)
    idle_after = rss_kib(srv.pid)
    idle_fds = fds(srv.pid)
    for s, f in socks:
        f.close()
        s.close()
    time.sleep(2)
    fds_end = fds(srv.pid)
    stop.set()
    peak_hwm = rss_kib(srv.pid, "VmHWM:")
    srv.terminate()
    srv.wait(10)
    ok = [r for r in results if r["ok"]]
    errors = [r for r in results if not r["ok"]]
    ttfd = sorted(r["ttfd"] for r in ok if "ttfd" in r)
    moved = sum(r.get("bytes", 0) for r in ok)
    pct = lambda v, q: v[min(len(v) - 1, int(q * len(v)))] if v else 0
    rep = {
        "seed": seed, "clients": a.clients, "streams": a.streams, "seconds": round(elapsed, 1),
        "file_mib": a.mib, "transfers": len(ok), "gets": sum(r["kind"] == "get" for r in ok),
        "puts": sum(r["kind"] == "put" for r in ok), "errors": len(errors),
        "error_samples": [e.get("why", "") for e in errors[:5]],
        "aggregate_mbit_s": round(moved * 8 / elapsed / 1e6, 1),
        "server_rss_kib_before": rss_before, "server_peak_rss_kib": max(peak[0], peak_hwm),
        "server_fds_before": fds_before, "server_fds_after_load": fds_after, "server_fds_end": fds_end,
        "ttfd_p50_s": round(pct(ttfd, 0.5), 4), "ttfd_p99_s": round(pct(ttfd, 0.99), 4),
        "idle_sessions": a.idle, "idle_rss_kib_before": idle_before, "idle_rss_kib_after": idle_after,
        "idle_fds": idle_fds,
        "kib_per_idle_session": round((idle_after - idle_before) / max(a.idle, 1), 1),
    }
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(rep, f, indent=1)
    cmdline = "bench/load.py " + " ".join(sys.argv[1:])
    with open(os.path.join(OUT, "report.md"), "w") as f:
        f.write(f"# Load test of xftp serve\n\nCommand: `{cmdline}` (seed {seed}). Loopback, {os.cpu_count()} CPUs.\n\n")
        f.write("| measure | value |\n|---|---|\n")
        for k, v in rep.items():
            f.write(f"| {k} | {v} |\n")
    print(json.dumps(rep, indent=1))
    subprocess.run(["rm", "-rf", work])
    return 0 if not errors and fds_end <= fds_before else 1


if __name__ == "__main__":
    sys.exit(main())
