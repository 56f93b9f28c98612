"""Nodes as network namespaces, for the tests and bench/netns.py.

A ``Cluster`` is a small data centre on this machine: a bridge in the root
namespace (the switch), and one network namespace per node joined to it by
a veth pair, each with an address on a private subnet and a name its
neighbours resolve (``ip netns exec`` mounts /etc/netns/NS/hosts over
/etc/hosts; each node runs in a UTS namespace of its own whose hostname is
its name, so torchrun's agents hand each other reachable addresses, as
machines' hostnames do). The object store, versitygw, is a namespace of its
own; every node runs a riffle daemon (``--tcp`` on its address, ``--peers``
every node's) and ``torchrun`` (c10d rendezvous hosted by node 0, gloo
between ranks), whose ranks read an s3:// dataset through riffle.torch
(netns_train.py).

Faults are what happens to a node: ``cut`` drops every packet to and from
it at the switch (its link stays up: nothing tells anyone, as with a
partition or a dead switch port), ``kill_daemon`` and ``restart_daemon``
(empty: a new process), ``slow`` a token-bucket shaper on what it sends,
what it receives, or both. Needs root, ``ip``, ``tc``, ``bridge`` and
``unshare``.

``close`` (and the context manager, and an atexit hook for a test process
that dies in between) kills every process in every namespace, then removes
the namespaces, the bridge and the hosts files; a cluster left behind by a
process that was killed outright is removed by the next one made.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

import riffle  # noqa: E402
from riffle import client  # noqa: E402

TRAIN = Path(__file__).with_name("netns_train.py")
SUBNET = "10.46.0"
STORE_IP = f"{SUBNET}.100"
S3_PORT = 9000
DAEMON_PORT = 7470
RDZV_PORT = 29400
TOKEN = "netns-token"
S3_ENV = {"AWS_ACCESS_KEY_ID": "ak", "AWS_SECRET_ACCESS_KEY": "sk", "AWS_REGION": "us-east-1",
          "RIFFLE_S3_ENDPOINT": f"http://store:{S3_PORT}"}
PREFIX = "rfl"  # every namespace, bridge and veth this module makes starts with it and the owner's pid


def digest(record: bytes) -> str:
    """What the ranks and the solo read keep of a record's bytes."""
    return hashlib.blake2b(record, digest_size=8).hexdigest()


def available() -> str | None:
    """None if this machine can run a Cluster, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "bridge", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        versitygw()
    except RuntimeError as e:
        return str(e)
    return None


def versitygw() -> str:
    for p in (shutil.which("versitygw"), os.path.expanduser("~/go/bin/versitygw")):
        if p and os.path.exists(p):
            return p
    raise RuntimeError("versitygw is not installed (scripts/install-deps.sh installs it)")


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip() or p.returncode}")
    return p


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_namespace(ns: str) -> None:
    """SIGKILL every process in namespace ns, and wait until none is left."""
    deadline = time.monotonic() + 20
    while True:
        pids = [int(p) for p in run("ip", "netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in namespace {ns} outlived SIGKILL")
        time.sleep(0.05)


def _links(tag: str) -> list[str]:
    out = []
    for line in run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        m = re.match(rf"\d+: ({tag}(?:v\d+|br))[@:]", line)
        if m:
            out.append(m[1])
    return out


def _remove(owner: int) -> None:
    """Remove everything a Cluster of process ``owner`` made, and wait until the kernel has."""
    tag = f"{PREFIX}{owner}"
    for ns in run("ip", "netns", "list", check=False).stdout.split("\n"):
        ns = ns.split(" ")[0]
        if re.fullmatch(rf"{tag}[sn]\d*", ns):
            _kill_namespace(ns)
            run("ip", "netns", "del", ns, check=False)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
    # A namespace's own end of a veth goes with it, but only once the
    # kernel gets to it: delete the bridge's ends (each takes its pair).
    deadline = time.monotonic() + 20
    while links := _links(tag):
        for link in links:
            run("ip", "link", "del", link, check=False)
        if time.monotonic() > deadline:
            raise RuntimeError(f"links {links} outlived their deletion")
        time.sleep(0.05)


def sweep() -> None:
    """Remove the clusters of processes that no longer exist (killed before they could clean up)."""
    owners = set()
    for line in run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        m = re.match(rf"\d+: {PREFIX}(\d+)(?:v\d+|br)[@:]", line)
        if m:
            owners.add(int(m[1]))
    for ns in run("ip", "netns", "list", check=False).stdout.split("\n"):
        m = re.fullmatch(rf"{PREFIX}(\d+)[sn]\d*", ns.split(" ")[0])
        if m:
            owners.add(int(m[1]))
    for owner in owners:
        if owner != os.getpid() and not _alive(owner):
            _remove(owner)


class Host:
    """One namespace on the bridge: an address, a name, and processes run in it."""

    def __init__(self, cluster: "Cluster", ns: str, name: str, ip: str, link: str):
        self.cluster, self.ns, self.name, self.ip, self.link = cluster, ns, name, ip, link

    def popen(self, argv: list[str], env: dict | None = None, log: Path | None = None, **kw) -> subprocess.Popen:
        """Start argv in this host's namespace, with its hostname, in a process group of its own."""
        out = open(log, "ab") if log else subprocess.DEVNULL
        cmd = ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
               self.name, *argv]
        try:
            p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        finally:
            if log:
                out.close()
        self.cluster.procs.append(p)
        return p

    def tc(self, *args: str) -> None:
        run("ip", "netns", "exec", self.ns, "tc", *args)


class Node(Host):
    """A machine of the cluster: its riffle daemon, and its torchrun."""

    def __init__(self, cluster: "Cluster", index: int, ns: str, ip: str, link: str):
        super().__init__(cluster, ns, f"node{index}", ip, link)
        self.index = index
        self.dir = cluster.dir / self.name
        self.dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.dir, 0o700)  # the daemon's socket directory must be its own, 0700
        self.sock = str(self.dir / "riffle.sock")
        self.daemon: subprocess.Popen | None = None
        self.torchrun: subprocess.Popen | None = None

    @property
    def addr(self) -> str:
        return f"{self.ip}:{DAEMON_PORT}"

    def start_daemon(self) -> None:
        """Start this node's daemon (an empty one: nothing of a daemon before it is kept) and wait for its socket."""
        c = self.cluster
        argv = [c.bin, "serve", "--socket", self.sock, "--quiet", "--tcp", self.addr, "--token", TOKEN,
                "--peers", ",".join(n.addr for n in c.nodes), "--node", str(self.index),
                "--peer-bytes", c.peer_bytes, "--peer-timeout", f"{c.peer_timeout}s", "--idle-exit", "0"]
        self.daemon = self.popen(argv, env=c.env(), log=self.dir / "daemon.log")
        if not client.wait_for_socket(self.sock, 30):
            raise RuntimeError(f"{self.name}'s daemon did not start: {(self.dir / 'daemon.log').read_text()[-2000:]}")

    def kill_daemon(self) -> None:
        """SIGKILL this node's daemon and wait for it to be gone (its socket file stays, answering no one)."""
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.kill()
            self.daemon.wait()

    def restart_daemon(self) -> None:
        self.kill_daemon()
        self.start_daemon()

    def status(self) -> dict:
        c = client.Connection(self.sock, autostart=False, timeout=10)
        try:
            return c.request({"op": "status"})[0]["status"]
        finally:
            c.close()


class Cluster:
    """``nodes`` nodes of ``ranks`` ranks each, and an object store, as namespaces on one bridge.

    ``dir`` holds the bucket (``dir/s3/bkt``, versitygw's POSIX back end),
    each node's socket and logs, and the ranks' outputs.
    """

    def __init__(self, dir: Path, nodes: int = 3, ranks: int = 2, peer_timeout: float = 2.0,
                 peer_bytes: str = "64MiB", bin: str | None = None):
        err = available()
        if err:
            raise RuntimeError(err)
        sweep()
        self.dir, self.ranks, self.peer_timeout, self.peer_bytes = Path(dir), ranks, peer_timeout, peer_bytes
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bin = bin or os.environ.get("RIFFLE_BIN") or str(REPO / "bin" / "riffle")
        self.tag = f"{PREFIX}{os.getpid()}"
        self.procs: list[subprocess.Popen] = []
        self.hosts: list[Host] = []
        self.closed = False
        atexit.register(self.close)
        try:
            self._network(nodes)
            self.bucket = self.dir / "s3" / "bkt"
            self.bucket.mkdir(parents=True, exist_ok=True)
            self.s3 = self.store.popen([versitygw(), "--access", "ak", "--secret", "sk", "--port",
                                        f"{STORE_IP}:{S3_PORT}", "posix", str(self.dir / "s3")],
                                       log=self.dir / "versitygw.log")
            self._wait_listening(self.store, S3_PORT)
            for n in self.nodes:
                n.start_daemon()
        except BaseException:
            self.close()
            raise

    # --- the network ---
    def _network(self, nodes: int) -> None:
        br = f"{self.tag}br"
        run("ip", "link", "add", br, "type", "bridge")
        run("ip", "link", "set", br, "up")
        self.nodes: list[Node] = []
        names = {STORE_IP: "store"}
        for i in range(nodes):
            names[f"{SUBNET}.{i + 1}"] = f"node{i}"
        hosts = "127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for ip, name in names.items())
        for k, (ip, name) in enumerate(names.items()):
            ns = f"{self.tag}s" if name == "store" else f"{self.tag}n{k - 1}"
            link = f"{self.tag}v{k}"
            run("ip", "netns", "add", ns)
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            Path(f"/etc/netns/{ns}/hosts").write_text(hosts)
            run("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
            run("ip", "link", "set", link, "master", br, "up")
            run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            if name == "store":
                self.store = Host(self, ns, name, ip, link)
                self.hosts.append(self.store)
            else:
                n = Node(self, k - 1, ns, ip, link)
                self.nodes.append(n)
                self.hosts.append(n)

    def _wait_listening(self, host: Host, port: int, timeout: float = 20) -> None:
        probe = f"import socket; socket.create_connection(({host.ip!r}, {port}), 0.5).close()"
        deadline = time.monotonic() + timeout
        while run("ip", "netns", "exec", host.ns, sys.executable, "-c", probe, check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {host.name}:{port}")
            time.sleep(0.05)

    def env(self, **extra: str) -> dict:
        e = dict(os.environ, **S3_ENV, RIFFLE_TOKEN=TOKEN, **extra)
        for k in ("RIFFLE_PEERS", "RIFFLE_NODE", "RIFFLE_SOCKET"):
            e.pop(k, None)
        return e

    def dataset(self, name: str, n: int, record_size: int, parts: int = 3) -> str:
        """Write n records (conftest.record: each begins with its id) into parts objects of bucket bkt under name/;
        returns their s3:// pattern."""
        from conftest import record
        d = self.bucket / name
        d.mkdir()
        bounds = [n * k // parts for k in range(parts + 1)]
        for k in range(parts):
            with open(d / f"part-{k}.bin", "wb") as f:
                for i in range(bounds[k], bounds[k + 1]):
                    f.write(record(i, record_size))
        return f"s3://bkt/{name}/*.bin"

    def solo(self, url: str, record_size: int) -> dict[int, str]:
        """Every record's digest by id, as one daemon with no peers reads the dataset straight from the object store
        (in the store's namespace): what every node's ranks must have got."""
        d = self.dir / "solo"
        d.mkdir(mode=0o700, exist_ok=True)
        sock = str(d / "riffle.sock")
        p = self.store.popen([self.bin, "serve", "--socket", sock, "--quiet"], env=self.env(), log=d / "daemon.log")
        try:
            if not client.wait_for_socket(sock, 30):
                raise RuntimeError(f"the solo daemon did not start: {(d / 'daemon.log').read_text()[-2000:]}")
            out: dict[int, str] = {}
            ld = riffle.Loader(url, 256, record_size=record_size, shuffle=False, socket=sock, autostart=False)
            for b in ld:
                for k, i in enumerate(b.ids.tolist()):
                    assert i not in out, f"the solo read gave record {i} twice"
                    out[i] = digest(bytes(b.record(k)))
            ld.close()
            return out
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    # --- faults ---
    def cut(self, node: Node) -> None:
        """Drop every packet to and from node at the switch: its link stays up, no error reaches anyone."""
        run("bridge", "link", "set", "dev", node.link, "state", "0")

    def heal(self, node: Node) -> None:
        run("bridge", "link", "set", "dev", node.link, "state", "3")

    def slow(self, node: Node, rate: str, out: bool = True, into: bool = True, burst: str = "32kb",
             latency: str = "200ms") -> None:
        """A token-bucket shaper (tbf) of rate on node's link: on what it sends (its end of the veth) if out, on what
        it receives (the bridge's end) if into."""
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        if out:
            node.tc("qdisc", "replace", "dev", "eth0", *tbf)
        if into:
            run("tc", "qdisc", "replace", "dev", node.link, *tbf)

    # --- training ---
    def launch(self, out: Path, args: list[str], min_nodes: int | None = None, max_restarts: int = 0,
               gloo_timeout: float = 60) -> None:
        """Start torchrun on every node: c10d rendezvous hosted by node 0's agent, ``ranks`` workers a node running
        netns_train.py with args, each reading through its node's daemon and writing to out."""
        out.mkdir(parents=True, exist_ok=True)
        n = len(self.nodes)
        for node in self.nodes:
            # is_host: node 0's agent hosts the rendezvous' store (torchrun would guess from the hostname, which
            # names no address it could bind here).
            conf = f"is_host={int(node.index == 0)},last_call_timeout=1,join_timeout=120"
            argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={min_nodes or n}:{n}",
                    f"--nproc_per_node={self.ranks}", "--rdzv_backend=c10d", f"--rdzv_endpoint=node0:{RDZV_PORT}",
                    f"--rdzv_id={self.tag}", f"--rdzv_conf={conf}", f"--max_restarts={max_restarts}",
                    "--monitor_interval=0.5", f"--log_dir={self.dir / 'torchrun'}",
                    # Debian's torch 1.13 on Python 3.11 reads the default "0" of both as None (a flag enum's
                    # zero is no longer iterated) and fails; 1 (stdout to a file under log_dir, and to the
                    # console) is read right.
                    "--redirects=1", "--tee=1", str(TRAIN), "--socket", node.sock, "--out", str(out),
                    "--node", str(node.index), "--gloo-timeout", str(gloo_timeout), *args]
            env = self.env(GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "python"))
            node.torchrun = node.popen(argv, env=env, log=self.dir / f"{node.name}-torchrun.log")

    def wait_at(self, out: Path, step: int, ranks: int, timeout: float = 120) -> None:
        """Wait until ranks ranks have finished step and stopped there (netns_train.py --pause-at)."""
        deadline = time.monotonic() + timeout
        while len(list(out.glob(f"at-{step}-*"))) < ranks:
            self._check_running()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(list(out.glob(f'at-{step}-*')))} of {ranks} ranks reached step {step} "
                                   f"in {timeout}s; see {self.dir}")
            time.sleep(0.05)

    @staticmethod
    def go(out: Path) -> None:
        (out / "go").touch()

    def _check_running(self) -> None:
        for n in self.nodes:
            if n.torchrun is not None and n.torchrun.poll() not in (None, 0):
                raise RuntimeError(f"{n.name}'s torchrun exited with {n.torchrun.returncode}: "
                                   f"{(self.dir / f'{n.name}-torchrun.log').read_text()[-3000:]}")

    def wait_done(self, nodes: list[Node], timeout: float = 240) -> None:
        """Wait until the torchrun of each of nodes has exited; each must exit 0."""
        deadline = time.monotonic() + timeout
        for n in nodes:
            try:
                rc = n.torchrun.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"{n.name}'s torchrun still runs after {timeout}s: "
                                   f"{(self.dir / f'{n.name}-torchrun.log').read_text()[-3000:]}") from None
            if rc != 0:
                raise RuntimeError(f"{n.name}'s torchrun exited with {rc}: "
                                   f"{(self.dir / f'{n.name}-torchrun.log').read_text()[-5000:]}")

    def stop_torchrun(self, node: Node) -> None:
        """SIGTERM node's torchrun agent, as what drains a node stops it: it stops its workers and leaves the
        rendezvous open for the other nodes (an agent that fails by itself closes it for every node)."""
        if node.torchrun is not None and node.torchrun.poll() is None:
            node.torchrun.send_signal(signal.SIGTERM)
            node.torchrun.wait(60)

    # --- cleanup ---
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.procs:
            p.wait()
        _remove(os.getpid())

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_outputs(out: Path) -> dict[str, dict]:
    """The ranks' logs (netns_train.py) by attempt: {attempt: {"ranks": {rank: header}, "batches": [...]}}."""
    attempts: dict[str, dict] = {}
    for f in sorted(out.glob("*.jsonl")):
        head, batches, tail = None, [], None
        lines = f.read_text().splitlines()
        for k, line in enumerate(lines):
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                if k == len(lines) - 1:
                    break  # a rank killed while it wrote its last line
                raise
            if "attempt" in d:
                head = d
            elif "started" in d:
                head["started"] = d["started"]
            elif "step" in d:
                batches.append(d)
            else:
                tail = d
        if head is None:
            continue
        a = attempts.setdefault(head["attempt"], {"ranks": {}, "batches": []})
        a["ranks"][head["rank"]] = dict(head, end=tail)
        a["resumed"], a["from"], a["world"] = head["resumed"], head["from"], head["world"]
        for b in batches:
            a["batches"].append(dict(b, rank=head["rank"], node=head["node"]))
    return attempts


def wait_gone(out: Path, node: int, timeout: float = 120) -> dict:
    """The line a rank of node wrote when its daemon was gone for good (netns_train.py)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for a in read_outputs(out).values():
            for r in a["ranks"].values():
                if r["node"] == node and r["end"] and "gone" in r["end"]:
                    return r["end"]
        time.sleep(0.05)
    raise TimeoutError(f"no rank of node {node} said its daemon was gone in {timeout}s")


def committed(attempts: dict[str, dict]) -> list[dict]:
    """The batches of the epoch as training kept them: the finished attempt's, then, back along the checkpoints each
    attempt resumed from, each earlier attempt's up to the step the next one resumed after. A step an attempt ran
    after the checkpoint the next resumed from was run again: its batches were thrown away with it."""
    done = [k for k, a in attempts.items() if all(r["end"] and r["end"].get("done") for r in a["ranks"].values())
            and len(a["ranks"]) == a["world"]]
    if len(done) != 1:
        raise AssertionError(f"{len(done)} attempts finished the epoch, want 1: {sorted(attempts)}")
    out, key, upto = [], done[0], None
    while key is not None:
        a = attempts[key]
        out += [b for b in a["batches"] if upto is None or b["step"] <= upto]
        key, upto = a["from"], a["resumed"]
        if key is not None and key not in attempts:
            raise AssertionError(f"an attempt resumed from a checkpoint of attempt {key}, which left no log")
    return out


def check_epoch(out: Path, solo: dict[int, str]) -> tuple[dict[str, dict], list[dict]]:
    """The epoch the ranks in out kept (committed) holds every record of the solo read once, each with its bytes.
    Returns the attempts and the committed batches."""
    attempts = read_outputs(out)
    batches = committed(attempts)
    seen: dict[int, tuple] = {}
    for b in batches:
        for i, d in zip(b["ids"], b["dig"]):
            if i in seen:
                raise AssertionError(f"record {i} came twice: to rank {seen[i][0]} at step {seen[i][1]} and to rank "
                                     f"{b['rank']} at step {b['step']}")
            seen[i] = (b["rank"], b["step"])
            if i not in solo:
                raise AssertionError(f"rank {b['rank']} got record {i}, which the dataset does not hold")
            if d != solo[i]:
                raise AssertionError(f"rank {b['rank']} (node {b['node']}) got record {i} with bytes other than a "
                                     f"solo read's")
    missing = sorted(set(solo) - set(seen))
    if missing:
        raise AssertionError(f"{len(missing)} records never came (first {missing[:10]})")
    return attempts, batches


def waits(attempts: dict[str, dict], nodes: set[int]) -> tuple[float, float]:
    """The longest a rank of nodes waited for a batch: for the first batch of an attempt (which opens its job), and
    for any other."""
    first = rest = 0.0
    for a in attempts.values():
        seen_first: set[int] = set()
        for b in sorted(a["batches"], key=lambda b: b["step"]):
            if b["node"] not in nodes:
                continue
            if b["rank"] in seen_first:
                rest = max(rest, b["wait"])
            else:
                seen_first.add(b["rank"])
                first = max(first, b["wait"])
    return first, rest
