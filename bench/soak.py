#!/usr/bin/env python3
"""Soak: mixed transfers for a long time over an emulated lossy link
whose emulator resets a random TCP flow every few seconds
(xftp-netem --reset-every). Downloads are retried with `xftp get -c`
(fetching only what is missing), uploads sent again; every file is
verified by SHA-256, and the server's memory and descriptors are sampled
over time. Needs root (network namespaces, TUN).

    bench/soak.py [--minutes 30] [--reset-every 5s] [--seed S]

Writes bench/out/soak/{results.json,report.md}; exit status non-zero if
any file could not be moved intact within its retries, or descriptors
leaked.
"""
import argparse, json, os, random, subprocess, sys, tempfile, time

from common import sha

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out", "soak")
BIN = os.path.join(ROOT, "target", "release")
XFTP = os.environ.get("XFTP", os.path.join(BIN, "xftp"))
NETEM = os.path.join(BIN, "xftp-netem")


def status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--reset-every", default="5s")
    ap.add_argument("--link", default="--rate 200mbit --delay 10ms --loss 0.01% --cc cubic")
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("skip: the soak needs root (network namespaces)")
        return 0
    seed = a.seed if a.seed is not None else int(time.time())
    rng = random.Random(seed)
    print(f"soak: seed {seed} (--seed {seed} repeats the mix)", flush=True)
    if not (os.path.exists(XFTP) and os.path.exists(NETEM)):
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "xftp", "-p", "xftp-netem"],
                       cwd=ROOT, check=True)
    os.makedirs(OUT, exist_ok=True)
    work = tempfile.mkdtemp(prefix="xftp-soak-")
    srv_root = os.path.join(work, "root")
    local = os.path.join(work, "local")
    os.makedirs(os.path.join(srv_root, "up"))
    os.makedirs(local)
    sizes = [1, 3, 8, 16, 32, 48]
    src = {}
    for mib in sizes:
        p = os.path.join(srv_root, f"f{mib}.bin")
        with open(p, "wb") as f:
            f.write(rng.randbytes(mib << 20))
        src[f"f{mib}.bin"] = sha(p)
        q = os.path.join(local, f"u{mib}.bin")
        with open(q, "wb") as f:
            f.write(rng.randbytes(mib << 20))
    name = f"xsoak{os.getpid() % 100000}"
    subprocess.run([NETEM, "down", "--name", name], capture_output=True)
    link_args = a.link.split() + ["--reset-every", a.reset_every, "--seed", str(seed)]
    link = subprocess.Popen([NETEM, "run", "--name", name, *link_args, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs = [link]
    try:
        line = link.stdout.readline()
        if not line.startswith("ready"):
            print("link did not come up:", line, link.stderr.read())
            return 1
        ns_a, ns_b = f"{name}a", f"{name}b"
        srv = subprocess.Popen(["ip", "netns", "exec", ns_b, XFTP, "serve", "--root", srv_root,
                                "--listen", "198.18.0.2:0", "--anonymous-write"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.insert(0, srv)
        port = int(srv.stdout.readline().strip().rsplit(":", 1)[1])
        time.sleep(0.5)
        # The server process itself (ip netns exec execs into it).
        spid = srv.pid
        base = f"ftp://198.18.0.2:{port}"
        fds0 = len(os.listdir(f"/proc/{spid}/fd"))
        timeline = []
        done, retries, failed = [], 0, []
        t_end = time.time() + a.minutes * 60
        t0 = time.time()
        last_sample = 0
        n = 0
        env = dict(os.environ, XDG_CACHE_HOME=os.path.join(work, "cache"))
        while time.time() < t_end:
            n += 1
            mib = rng.choice(sizes)
            streams = rng.choice(["1", "2", "4", "8", "auto"])
            get = rng.random() < 0.5
            ok = False
            for attempt in range(20):
                if get:
                    dst = os.path.join(local, "got.bin")
                    argv = [XFTP, "get", "-c", "-p", streams, "--timeout", "15",
                            f"{base}/f{mib}.bin", dst]
                else:
                    dst = os.path.join(srv_root, "up", f"u{n}.bin")
                    argv = [XFTP, "put", "-p", streams, "--timeout", "15",
                            os.path.join(local, f"u{mib}.bin"), f"{base}/up/u{n}.bin"]
                p = subprocess.run(["ip", "netns", "exec", ns_a, *argv], capture_output=True,
                                   text=True, env=env)
                if p.returncode == 0:
                    want = src[f"f{mib}.bin"] if get else sha(os.path.join(local, f"u{mib}.bin"))
                    ok = sha(dst) == want
                    if not ok:
                        failed.append({"n": n, "why": "content differs", "argv": argv})
                    os.remove(dst)
                    break
                retries += 1
            else:
                failed.append({"n": n, "why": "20 attempts failed", "argv": argv,
                               "last": p.stderr.strip()[-300:]})
            if ok:
                done.append({"get": get, "mib": mib, "streams": streams})
            if time.time() - last_sample > 10:
                last_sample = time.time()
                timeline.append({"t": round(time.time() - t0), "rss_kib": status(spid, "VmRSS:"),
                                 "fds": len(os.listdir(f"/proc/{spid}/fd"))})
        time.sleep(2)
        fds1 = len(os.listdir(f"/proc/{spid}/fd"))
        peak = status(spid, "VmHWM:")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    counters = {}
    try:
        counters = json.loads(link.stdout.read().strip().splitlines()[-1])["counters"]
    except (ValueError, IndexError, KeyError):
        pass
    subprocess.run([NETEM, "down", "--name", name], capture_output=True)
    rep = {
        "seed": seed, "minutes": a.minutes, "link": " ".join(link_args),
        "transfers_verified": len(done), "gets": sum(d["get"] for d in done),
        "puts": sum(not d["get"] for d in done),
        "mib_moved": sum(d["mib"] for d in done), "retries": retries, "failed": failed,
        "flows_reset": counters.get("a_to_b", {}).get("resets"),
        "server_fds_start": fds0, "server_fds_end": fds1, "server_peak_rss_kib": peak,
        "timeline": timeline,
    }
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(rep, f, indent=1)
    rss = [t["rss_kib"] for t in timeline] or [0]
    with open(os.path.join(OUT, "report.md"), "w") as f:
        f.write("# Soak\n\n")
        f.write(f"Command: `bench/soak.py {' '.join(sys.argv[1:])}` (seed {seed}); link `{rep['link']}`.\n\n")
        f.write("| measure | value |\n|---|---|\n")
        for k in ["transfers_verified", "gets", "puts", "mib_moved", "retries", "flows_reset",
                  "server_fds_start", "server_fds_end", "server_peak_rss_kib"]:
            f.write(f"| {k} | {rep[k]} |\n")
        f.write(f"| failed | {len(failed)} |\n")
        f.write(f"| server RSS over time (KiB): first, max, last | {rss[0]}, {max(rss)}, {rss[-1]} |\n")
    print(json.dumps({k: v for k, v in rep.items() if k != "timeline"}, indent=1))
    subprocess.run(["rm", "-rf", work])
    return 0 if not failed and fds1 <= fds0 else 1


if __name__ == "__main__":
    sys.exit(main())
