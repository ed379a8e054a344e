#!/usr/bin/env python3
"""Mix: random transfers over random emulated links, every copy checked.

A yardstick no fixed case can be tuned to. From one seed (printed, and
given back with --seed to replay a run) it draws LINKS links (rate,
delay, loss, router queue, congestion control, sometimes a capped
window) and on each TRANSFERS transfers out of:

  * xftp get / put, with -p 1..16 or auto, passive, --active or --mprt,
    in clear or under TLS, sometimes --verify, --static or --limit-rate;
  * get -c / put -c over a partial copy (a random prefix left behind);
  * get -r / put -r of a random tree (nested directories, empty files,
    files around the record size);
  * stock peers against `xftp serve`: curl and lftp (in clear and TLS),
    globus-url-copy -p N (MODE E);
  * `xftp get/put` against stock servers: pyftpdlib, and
    globus-gridftp-server (xftp's GridFTP client, MODE E);
  * `xftp shell` as a script: mult N, a get, ls and a put on one session
    (every other one as reget and reput).

File sizes come from the edges (0, 1, a record and one byte either side)
and from random sizes bounded by what the link carries in a few seconds.
A transfer fails if its command fails, times out, or leaves a copy that
differs from the original. Each failure prints the command, its output
and how to replay the run. Needs root (network namespaces, TUN); without
it prints SKIP and exits 0 (with XFTP_REQUIRE_PEERS=1 it fails).

    bench/mix.py [--seed S] [--links 3] [--transfers 15] [--only N] [--budget SECS]

Writes bench/out/mix/{results.jsonl,report.md}; exit status 1 if any
transfer failed.
"""
import argparse
import json
import math
import os
import re
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from common import sha

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release")
XFTP = os.environ.get("XFTP", os.path.join(BIN, "xftp"))
NETEM = os.environ.get("XFTP_NETEM", os.path.join(BIN, "xftp-netem"))
OUT = os.path.join(os.environ.get("BENCH_OUT", os.path.join(ROOT, "bench", "out")), "mix")
SERVER = "198.18.0.2"
RECORD = 256 * 1024
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(1 if os.environ.get("XFTP_REQUIRE_PEERS") == "1" else 0)


def have(prog):
    return shutil.which(prog) is not None


def have_pyftpdlib():
    return subprocess.run([PYTHON, "-c", "import pyftpdlib"], capture_output=True).returncode == 0


def draw_link(rnd, seed):
    """A link from a wide distribution: what a user might meet, not a profile."""
    rate = math.exp(rnd.uniform(math.log(4), math.log(400)))  # Mbit/s
    delay = math.exp(rnd.uniform(math.log(0.3), math.log(60)))  # ms, one way
    bdp = rate * 1e6 / 8 * (2 * delay / 1e3)
    queue = max(4500, int(bdp * rnd.uniform(0.2, 2.0)))
    loss = 0.0 if rnd.random() < 0.4 else math.exp(rnd.uniform(math.log(1e-4), math.log(1e-2)))
    cc = rnd.choice(["cubic", "bbr", "reno"])
    args = ["--rate", f"{rate:.3f}mbit", "--delay", f"{delay:.3f}ms", "--queue", f"{queue}b", "--cc", cc]
    if loss:
        args += ["--loss", f"{loss:.6f}", "--seed", str(rnd.randrange(1 << 30))]
    reset = None
    if rnd.random() < 0.25:
        # Fault injection: a random TCP flow reset every few seconds; on
        # such a link xftp transfers run with -c and are run again until
        # complete, and peers are left out (they cannot resume ranges).
        reset = rnd.uniform(1.5, 6.0)
        args += ["--reset-every", f"{reset:.1f}s"]
        if not loss:
            args += ["--seed", str(rnd.randrange(1 << 30))]
    window = None
    if rnd.random() < 0.3:
        window = rnd.randrange(32 << 10, 256 << 10)
        args += ["--max-window", str(window)]
    # What one connection of the mix can count on, roughly: the link, or
    # its window over the RTT, or its loss recovery (Mathis), whichever
    # is least; used only to size files and time limits.
    rtt = max(2 * delay / 1e3, 0.001)
    per = rate * 1e6 / 8
    if window:
        per = min(per, window / rtt)
    if loss:
        per = min(per, 1448 * 1.22 / (rtt * math.sqrt(loss)))
    return {"args": args, "reset": reset, "rate": rate, "rtt_ms": 2 * delay, "loss": loss, "cc": cc, "per_conn": per}


def tree_digest(top):
    """Relative path -> sha256 of every file, and the set of directories."""
    files, dirs = {}, set()
    for d, subdirs, names in os.walk(top):
        rel = os.path.relpath(d, top)
        for s in subdirs:
            dirs.add(os.path.normpath(os.path.join(rel, s)))
        for n in names:
            files[os.path.normpath(os.path.join(rel, n))] = sha(os.path.join(d, n))
    return files, dirs


def write_random(path, size, rnd):
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 1 << 20)
            f.write(rnd.randbytes(n))
            left -= n


def pick_size(rnd, cap):
    edge = [0, 1, RECORD - 1, RECORD, RECORD + 1, 100_000]
    if rnd.random() < 0.35:
        return rnd.choice(edge)
    return rnd.randrange(1, max(2, cap))


def make_tree(top, rnd, cap):
    os.makedirs(top)
    dirs = [top]
    for _ in range(rnd.randrange(0, 4)):
        d = os.path.join(rnd.choice(dirs), f"d{len(dirs)}")
        os.makedirs(d)
        dirs.append(d)
    total = 0
    for i in range(rnd.randrange(1, 25)):
        size = rnd.choice([0, 1, rnd.randrange(1, 64 << 10), rnd.randrange(1, max(2, cap // 4))])
        write_random(os.path.join(rnd.choice(dirs), f"f{i}.bin"), size, rnd)
        total += size
    return total


class Mix:
    def __init__(self, seed, work, cert, key):
        self.seed = seed
        self.work = work
        self.cert, self.key = cert, key
        self.results = []
        self.procs = []
        self.kinds = None

    def ns(self, side, cmd):
        return ["ip", "netns", "exec", self.name + side] + cmd

    def start_link(self, li, link):
        self.name = f"xmix{os.getpid() % 10000}l{li}"
        self.link_log = open(os.path.join(self.work, f"link{li}.log"), "w")
        self.link = subprocess.Popen([NETEM, "run", "--name", self.name] + link["args"],
                                     stdout=self.link_log, stderr=subprocess.STDOUT)
        for _ in range(200):
            with open(self.link_log.name) as f:
                if "ready" in f.read():
                    break
            if self.link.poll() is not None:
                raise RuntimeError(f"xftp-netem exited: {open(self.link_log.name).read()[-500:]}")
            time.sleep(0.05)
        else:
            raise RuntimeError("xftp-netem did not report ready")
        self.srv_root = os.path.join(self.work, f"srv{li}")
        os.makedirs(self.srv_root)
        os.chmod(self.work, 0o755)
        os.chmod(self.srv_root, 0o777)
        cmd = [XFTP, "serve", "--root", self.srv_root, "--listen", f"{SERVER}:2121",
               "--anonymous-write", "--max-streams", "64"]
        if self.cert:
            cmd += ["--tls-cert", self.cert, "--tls-key", self.key]
        self.srv_log = os.path.join(self.work, f"serve{li}.log")
        self.srv = subprocess.Popen(self.ns("b", cmd), stdout=open(self.srv_log, "w"), stderr=subprocess.STDOUT)
        self.procs = [self.srv]
        self.stock = None
        if have_pyftpdlib():
            self.stock_root = os.path.join(self.work, f"stock{li}")
            os.makedirs(self.stock_root)
            os.chmod(self.stock_root, 0o777)
            self.stock = subprocess.Popen(
                self.ns("b", [PYTHON, "-m", "pyftpdlib", "-i", SERVER, "-p", "2122", "-w", "-d", self.stock_root]),
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.work, f"stock{li}.log"), "w"))
            self.procs.append(self.stock)
        self.grid = None
        if have("globus-gridftp-server"):
            # Anonymous, as nobody: its directory is open to all.
            self.grid_root = os.path.join(self.work, f"grid{li}")
            os.makedirs(self.grid_root)
            os.chmod(self.grid_root, 0o777)
            self.grid = subprocess.Popen(
                self.ns("b", ["globus-gridftp-server", "-aa", "-anonymous-user", "nobody", "-data-interface",
                              SERVER, "-p", "2811", "-d", "error", "-l", os.path.join(self.work, f"grid{li}.log"),
                              "-disable-usage-stats"]),
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.work, f"grid{li}.err"), "w"))
            self.procs.append(self.grid)
        self.wait_port(2121)
        if self.stock:
            self.wait_port(2122)
        if self.grid:
            self.wait_port(2811)

    def wait_port(self, port):
        for _ in range(100):
            r = subprocess.run(self.ns("a", ["bash", "-c", f"exec 3<>/dev/tcp/{SERVER}/{port}"]),
                               capture_output=True)
            if r.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"nothing listens on {SERVER}:{port}")

    def stop_link(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs = []
        if self.link.poll() is None:
            self.link.send_signal(signal.SIGTERM)
            try:
                self.link.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.link.kill()
                self.link.wait()
        subprocess.run([NETEM, "down", "--name", self.name], capture_output=True)

    def run(self, cmd, timeout, cwd=None, stdin=None):
        t = time.time()
        try:
            r = subprocess.run(self.ns("a", cmd), capture_output=True, timeout=timeout, cwd=cwd,
                               input=stdin.encode() if stdin is not None else None,
                               env=dict(os.environ, XDG_CACHE_HOME=os.path.join(self.work, "cache")))
            rc, out = r.returncode, (r.stdout.decode(errors="replace")[-1500:] + r.stderr.decode(errors="replace")[-1500:])
        except subprocess.TimeoutExpired as e:
            rc = "timeout"
            out = ((e.stdout or b"").decode(errors="replace")[-1500:] + (e.stderr or b"").decode(errors="replace")[-1500:])
        return rc, out, time.time() - t

    def transfer(self, li, ti, link, rnd):
        """Draw one transfer, run it, check it; returns a result record."""
        cap = int(min(8 << 20, max(64 << 10, link["per_conn"] * 4 * 3)))
        cut = link["reset"] is not None
        kinds = ["get", "get", "put", "put", "getover", "putover", "getr", "putr"]
        if not cut:
            kinds += [k for k in ("curl", "lftp") if have(k)]
            if have("globus-url-copy"):
                kinds += ["globus"]
            if self.stock:
                kinds += ["stock"]
            if self.grid:
                kinds += ["gridftp"]
            kinds += ["shell"]
        if self.kinds:
            kinds = [k for k in kinds if k in self.kinds] or kinds
        kind = rnd.choice(kinds)
        tls = self.cert is not None and rnd.random() < 0.4
        p = rnd.choice(["1", "2", "4", "8", "16", "auto", "auto"])
        d = os.path.join(self.work, f"t{li}-{ti}")
        os.makedirs(d)
        srv = self.srv_root
        name = f"t{ti}.bin"
        url = f"ftp://{SERVER}:2121/{name}"
        cli = os.path.join(d, "copy.bin")
        x = [XFTP]
        opts = ["-p", p, "--json", "-q", "--timeout", "20" if cut else "30"]
        opts += rnd.choice([[], [], ["--active"], ["--mprt"]])
        if tls:
            opts += ["--tls", "--insecure"]
        extra = rnd.random()
        if extra < 0.1:
            opts += ["--verify"]
        elif extra < 0.15 and p not in ("auto", "1") and not cut:
            opts += ["--static"]
        elif extra < 0.2 and not cut:
            opts += ["--limit-rate", str(int(max(64 << 10, link["rate"] * 1e6 / 8 / 2)))]
        # On a link that resets flows, half the transfers run again from
        # outside (the loop below), half with --retries in one command
        # (by the transfer's index: the draws stay those of the seed).
        inner = cut and ti % 2 == 1
        if cut:
            opts += ["-c"]
        if inner:
            opts += ["--retries", "29", "--retry-wait", "0.2"]
        size = pick_size(rnd, cap)
        src = os.path.join(d, "src.bin")
        stdin = None
        before = None  # what a cut run may leave at the destination
        if kind in ("get", "getover"):
            write_random(os.path.join(srv, name), size, rnd)
            src = os.path.join(srv, name)
            if kind == "getover":
                # An older, different file where the copy goes: replaced
                # whole, or left as it was by a run that did not finish.
                before = rnd.randbytes(rnd.randrange(0, 200_000))
                with open(cli, "wb") as g:
                    g.write(before)
            cmd = x + ["get", url, cli] + opts
            expect = ("file", cli, src)
        elif kind in ("put", "putover"):
            write_random(src, size, rnd)
            dst = os.path.join(srv, name)
            if kind == "putover":
                before = rnd.randbytes(rnd.randrange(0, 200_000))
                with open(dst, "wb") as g:
                    g.write(before)
                os.chmod(dst, 0o666)
            cmd = x + ["put", src, url] + opts
            expect = ("file", dst, src)
        elif kind == "getr":
            top = os.path.join(srv, f"tree{ti}")
            size = make_tree(top, rnd, cap)
            for dd, _, _ in os.walk(top):
                os.chmod(dd, 0o777)
            opts = [o for o in opts if o not in ("--static", "--verify")]
            cmd = x + ["get", "-r", f"ftp://{SERVER}:2121/tree{ti}/", cli, "--concurrency",
                       str(rnd.choice([1, 2, 4, 8]))] + opts
            expect = ("tree", cli, top)
        elif kind == "putr":
            top = os.path.join(d, "tree")
            size = make_tree(top, rnd, cap)
            opts = [o for o in opts if o not in ("--static", "--verify")]
            cmd = x + ["put", "-r", top, f"ftp://{SERVER}:2121/up{ti}/", "--concurrency",
                       str(rnd.choice([1, 2, 4, 8]))] + opts
            expect = ("tree", os.path.join(srv, f"up{ti}"), top)
        elif kind == "curl":
            p = "-"
            c = ["curl", "-sS", "--max-time", "120"] + (["--ssl-reqd", "-k"] if tls else [])
            # Active mode only in clear: curl 7.87-7.88 cannot take an
            # active data connection under TLS (curl/curl#10666, fixed in 8.0).
            if not tls:
                c += rnd.choice([[], ["-P", "-"]])
            if rnd.random() < 0.5:
                write_random(os.path.join(srv, name), size, rnd)
                cmd, expect = c + ["-o", cli, url], ("file", cli, os.path.join(srv, name))
            else:
                write_random(src, size, rnd)
                cmd, expect = c + ["-T", src, url], ("file", os.path.join(srv, name), src)
        elif kind == "lftp":
            p = "-"
            sets = "set net:max-retries 1; set net:timeout 30; "
            sets += f"set ftp:passive-mode {rnd.choice(['on', 'off'])}; "
            if tls:
                sets += ("set ftp:ssl-force true; set ftp:ssl-protect-data true; "
                         "set ftp:ssl-allow-anonymous true; set ssl:verify-certificate no; ")
            else:
                sets += "set ftp:ssl-allow false; "
            if rnd.random() < 0.5:
                write_random(os.path.join(srv, name), size, rnd)
                cmd = ["lftp", "-c", f"{sets}open -p 2121 {SERVER}; get {name} -o {cli}"]
                expect = ("file", cli, os.path.join(srv, name))
            else:
                write_random(src, size, rnd)
                cmd = ["lftp", "-c", f"{sets}open -p 2121 {SERVER}; put {src} -o {name}"]
                expect = ("file", os.path.join(srv, name), src)
        elif kind == "globus":
            tls = False
            p = rnd.choice(["1", "2", "4", "8"])
            g = ["globus-url-copy", "-p", p]
            if rnd.random() < 0.5:
                write_random(os.path.join(srv, name), size, rnd)
                cmd = g + [url, f"file://{cli}"]
                expect = ("file", cli, os.path.join(srv, name))
            else:
                write_random(src, size, rnd)
                cmd = g + [f"file://{src}", url]
                expect = ("file", os.path.join(srv, name), src)
        elif kind == "gridftp":
            # xftp's GridFTP client (MODE E, the server's parallelism)
            # against globus-gridftp-server; absolute paths take "//".
            tls = False
            gopts = [o for o in opts if o not in ("--tls", "--insecure", "--mprt", "--static")]
            gurl = f"ftp://{SERVER}:2811/{self.grid_root}/{name}"
            if rnd.random() < 0.5:
                g = os.path.join(self.grid_root, name)
                write_random(g, size, rnd)
                os.chmod(g, 0o644)
                cmd = x + ["get", gurl, cli] + gopts
                expect = ("file", cli, g)
            else:
                write_random(src, size, rnd)
                os.chmod(d, 0o755)
                os.chmod(src, 0o644)
                cmd = x + ["put", src, gurl] + gopts
                expect = ("file", os.path.join(self.grid_root, name), src)
        elif kind == "shell":
            # The interactive client as a script: mult, a get and a put on
            # one session, with the listing between them.
            base = f"{'ftpes' if tls else 'ftp'}://{SERVER}:2121/"
            write_random(os.path.join(srv, name), size, rnd)
            up = os.path.join(d, "up.bin")
            write_random(up, pick_size(rnd, cap), rnd)
            # Every other one resumably (reget, reput; chosen by the
            # transfer's index so that a seed's draw stays the same).
            g, pu = ("reget", "reput") if ti % 2 else ("get", "put")
            script = f"mult {p}\n{g} {name} {cli}\nls\n{pu} {up} s{ti}.bin\nquit\n"
            cmd = x + ["shell", base, "--timeout", "30"] + (["--insecure"] if tls else [])
            stdin = script
            expect = ("files", [(cli, os.path.join(srv, name)), (os.path.join(srv, f"s{ti}.bin"), up)], None)
        else:  # stock: xftp against pyftpdlib
            surl = f"ftp://{SERVER}:2122/{name}"
            sopts = [o for o in opts if o not in ("--tls", "--insecure", "--mprt", "--static", "--verify")]
            tls = False
            if rnd.random() < 0.5:
                write_random(os.path.join(self.stock_root, name), size, rnd)
                cmd = x + ["get", surl, cli] + sopts
                expect = ("file", cli, os.path.join(self.stock_root, name))
            else:
                write_random(src, size, rnd)
                cmd = x + ["put", src, surl] + sopts
                expect = ("file", os.path.join(self.stock_root, name), src)
        # Time enough for the bytes at a quarter of one connection's share,
        # plus handshakes; a stuck transfer still ends the run.
        timeout = 60 + 4 * size / max(link["per_conn"], 1e4) + 40 * link["rtt_ms"] / 1e3
        timeout = min(timeout, 300)
        how, got, want = expect
        attempts, secs, ok, why, out = 0, 0.0, False, "", ""
        # On a link that resets flows, the same command again resumes
        # (-c); every cut run must leave nothing that looks complete.
        # A run ends at a reset of its control connection, of a data
        # connection outside the endgame (stock peers, files under 1 MiB,
        # stream mode), or of its last data connection: up to 30 runs,
        # and 400 s, to complete.
        if inner:
            timeout = 400 + timeout
        for attempts in range(1, (30 if cut and not inner else 1) + 1):
            if cut and secs > 400:
                break
            rc, out, t = self.run(cmd, timeout, stdin=stdin)
            secs += t
            if inner:
                # The runs of the one command, as its summary counts them.
                m = re.search(r'"runs":(\d+)', out)
                attempts = int(m.group(1)) if m else 1
            if rc == 0:
                ok, why = self.check(how, got, want)
                break
            why = f"exit status {rc}"
            bad = self.cut_left_wrong(how, got, want, before)
            if bad:
                why = f"exit status {rc}, and {bad}"
                break
        rec = {"link": li, "transfer": ti, "kind": kind, "tls": tls, "p": p, "bytes": size,
               "seconds": round(secs, 2), "attempts": attempts, "ok": ok, "command": " ".join(cmd)}
        if not ok:
            rec["why"] = why
            rec["output"] = out
        shutil.rmtree(d, ignore_errors=True)
        for f in (os.path.join(srv, name), os.path.join(srv, f"s{ti}.bin")):
            if os.path.exists(f):
                os.remove(f)
        return rec

    @staticmethod
    def check(how, got, want):
        if how == "files":
            for g, w in got:
                ok, why = Mix.check("file", g, w)
                if not ok:
                    return ok, why
            return True, ""
        if how == "file":
            if not os.path.exists(got):
                return False, f"no copy at {got}"
            if os.path.getsize(got) != os.path.getsize(want) or sha(got) != sha(want):
                return False, f"copy differs: {os.path.getsize(got)} B against {os.path.getsize(want)} B"
            return True, ""
        if not os.path.isdir(got):
            return False, f"no tree at {got}"
        a, b = tree_digest(got), tree_digest(want)
        if a != b:
            return False, (f"tree differs: {len(a[0])} files/{len(a[1])} dirs against {len(b[0])}/{len(b[1])};"
                           f" differing: {sorted(set(a[0].items()) ^ set(b[0].items()))[:3]}")
        return True, ""

    @staticmethod
    def cut_left_wrong(how, got, want, before):
        """After a failed run: a file in place must be whole (or the old one)."""
        if how == "files":
            for g, w in got:
                bad = Mix.cut_left_wrong("file", g, w, None)
                if bad:
                    return bad
            return None
        if how == "file":
            if not os.path.exists(got):
                return None
            with open(got, "rb") as f:
                now = f.read()
            if before is not None and now == before:
                return None
            if os.path.getsize(got) == os.path.getsize(want) and sha(got) == sha(want):
                return None
            return f"it left {len(now)} B at {got} that are neither the file nor what was there"
        if not os.path.isdir(got):
            return None
        have, _ = tree_digest(got)
        wanted, _ = tree_digest(want)
        for rel, h in have.items():
            if os.path.basename(rel).startswith(".") and ".xftp-part" in rel:
                continue
            if wanted.get(rel) != h:
                return f"it left {rel} in the tree, not a whole copy of the original"
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--links", type=int, default=3)
    ap.add_argument("--transfers", type=int, default=15, help="per link")
    ap.add_argument("--only", type=int, default=None, help="run only link N of the seed's draw")
    ap.add_argument("--kinds", default=None,
                    help="comma-separated: draw only these kinds (get, put, getover, putover, getr, putr, curl, "
                         "lftp, globus, stock, gridftp, shell)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds: draw no new transfer past this (the ones run are still checked)")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "big") % 2_000_000_000
    print(f"mix: seed {seed} (replay: bench/mix.py --seed {seed} --links {a.links} --transfers {a.transfers})",
          flush=True)
    if os.geteuid() != 0:
        skip("bench/mix.py needs root (network namespaces, TUN devices)")
    for b in (XFTP, NETEM):
        if not os.access(b, os.X_OK):
            skip(f"{b} not built (cargo build --release -p xftp -p xftp-netem)")
    os.makedirs(OUT, exist_ok=True)
    work = tempfile.mkdtemp(prefix="xftp-mix-")
    os.chmod(work, 0o755)
    cert = key = None
    if have("openssl"):
        cert, key = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={SERVER}",
                        "-addext", f"subjectAltName=IP:{SERVER}"], check=True, capture_output=True)
        os.chmod(key, 0o644)
    else:
        print("mix: no openssl here: no TLS transfers in this run")
    rnd = random.Random(seed)
    links = [draw_link(rnd, seed) for _ in range(a.links)]
    m = Mix(seed, work, cert, key)
    m.kinds = set(a.kinds.split(",")) if a.kinds else None
    fails = 0
    started = time.time()
    with open(os.path.join(OUT, "results.jsonl"), "w") as log:
        for li, link in enumerate(links):
            # Each link's transfers draw from their own stream, so that
            # --only N replays link N exactly.
            lr = random.Random(f"{seed}-{li}")
            if a.only is not None and li != a.only:
                continue
            print(f"link {li}: xftp-netem run {' '.join(link['args'])}"
                  f"  (about {link['per_conn'] * 8 / 1e6:.1f} Mbit/s per connection)", flush=True)
            m.start_link(li, link)
            try:
                for ti in range(a.transfers):
                    if a.budget is not None and time.time() - started > a.budget:
                        print(f"  budget of {a.budget:.0f} s spent: transfers {ti}.. of this link not run",
                              flush=True)
                        break
                    r = m.transfer(li, ti, link, lr)
                    r["link_args"] = " ".join(link["args"])
                    log.write(json.dumps(r) + "\n")
                    log.flush()
                    m.results.append(r)
                    flag = "ok" if r["ok"] else "FAILED"
                    runs = f" ({r['attempts']} runs)" if r["attempts"] > 1 else ""
                    print(f"  {ti:3} {r['kind']:7} {'tls' if r['tls'] else '   '} -p {r['p']:4} {r['bytes']:9} B"
                          f" {r['seconds']:7.2f} s  {flag}{runs}", flush=True)
                    if not r["ok"]:
                        fails += 1
                        print(f"      {r['why']}\n      command: {r['command']}\n      output: "
                              + r["output"].strip().replace("\n", "\n        "), flush=True)
                        print(f"      replay: bench/mix.py --seed {seed} --links {a.links} "
                              f"--transfers {a.transfers} --only {li}", flush=True)
            finally:
                m.stop_link()
    n = len(m.results)
    with open(os.path.join(OUT, "report.md"), "w") as f:
        f.write(f"# mix, seed {seed}\n\n`bench/mix.py --seed {seed} --links {a.links} --transfers {a.transfers}`\n\n")
        f.write(f"{n} transfers, {fails} failed, {time.time() - started:.0f} s\n\n")
        f.write("| link | # | kind | TLS | -p | bytes | s | result |\n|---|---|---|---|---|---|---|---|\n")
        for r in m.results:
            f.write(f"| {r['link']} | {r['transfer']} | {r['kind']} | {'yes' if r['tls'] else ''} | {r['p']} |"
                    f" {r['bytes']} | {r['seconds']} | {'ok' if r['ok'] else 'FAILED: ' + r['why']} |\n")
    if fails == 0:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"mix: logs kept in {work}")
    print(f"mix: seed {seed}: {n} transfers, {fails} failed, {time.time() - started:.0f} s")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
