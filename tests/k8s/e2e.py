"""A real Kubernetes control plane on brain, driven with kubectl.

    python -m tests.k8s.e2e                      # full run over TCP (+ etcd 3.6 baseline), smoke over mTLS and unix
    python -m tests.k8s.e2e --transport tcp --profile full --baseline etcd-3.6
    python -m tests.k8s.e2e --transport unix --profile smoke --keep

What one run does (every wait is bounded; see docs/kubernetes.md):
  1. builds (or finds cached) kube-apiserver, kube-controller-manager,
     kube-scheduler, kubectl and kwok via tests/k8s/build.sh;
  2. starts brain on loopback (http, https with client certificates, or a unix
     socket), then kube-apiserver with --etcd-servers at it, then
     kube-controller-manager and kube-scheduler (--leader-elect=false) and
     kwok faking the nodes;
  3. with kubectl: namespaces; N ConfigMaps created in parallel chunks and
     listed back with --chunk-size paging; a CRD and objects of it (list, get,
     patch, delete); a Deployment that becomes fully Running on the kwok
     nodes; `kubectl get -w` streams that must see the changes;
  4. restarts brain (SIGTERM, start again on the same data dir), then kills it
     with kill -9 while ConfigMaps are being created through the apiserver,
     and after each checks: the keyspace at the revision read just before is
     identical key for key (value, create/mod revision, version), every key
     that differs at the head was written after that revision, every object
     (ConfigMaps, Widgets, the Deployment, pods) is still there at the same
     resourceVersion, every ConfigMap the apiserver acknowledged (201) during
     the kill -9 is there, the apiserver recovers, and the watches opened
     before still deliver;
  5. scales the Deployment down, rolls it, deletes it;
  6. checks event TTL expiry and compaction, /readyz (etcd checks), the
     apiserver log (no etcd errors outside the restart, RequestWatchProgress
     not refused) and its metrics (consistent reads served from the watch
     cache; request latency percentiles against the SIG Scalability SLOs).
With --transport groups the storage is `brain groups` (docs/groups.md): node
Leases and Events in a group of their own, everything else in the main group,
kube-apiserver given the flags `brain groups --print-flags` prints; in place
of the restarts the run checks where each resource's keys are (etcdctl on
each group), that each object's resourceVersion is its key's mod revision in
its own group, kills the Leases-and-Events group with kill -9 (brain groups
starts it again) and checks both groups are compacted.
With --baseline etcd-3.6 (the default for the full TCP run) the same
scenario then runs on etcd 3.6.16 (benchmarks/build.sh's etcd-3.6) in the
same invocation, and the summary puts its latencies next to brain's.
Prints a summary and writes summary.json in the work directory. Exit code 0
when every check passed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.k8s import promstats  # noqa: E402
from tests.k8s.cluster import (BrainCluster, BrainGroups, SERVICE_IP, Brain, ControlPlane, Etcd,  # noqa: E402
                               StartError)
from tests.k8s.pki import make_cluster_pki  # noqa: E402

HERE = Path(__file__).resolve().parent
CRD_GROUP = "e2e.brain.test"
SLO = {"mutating": 1.0, "get": 1.0, "list": 30.0}  # p99 seconds, SIG Scalability


@dataclass(frozen=True)
class Profile:
    name: str
    configmaps: int
    list_chunk: int
    create_chunk: int
    parallel: int
    widgets: int
    nodes: int
    replicas: int
    scale_to: int
    rollout_timeout: float


PROFILES = {
    "full": Profile("full", configmaps=5000, list_chunk=500, create_chunk=250, parallel=4,
                    widgets=200, nodes=20, replicas=200, scale_to=50, rollout_timeout=420),
    "smoke": Profile("smoke", configmaps=300, list_chunk=50, create_chunk=100, parallel=3,
                     widgets=20, nodes=3, replicas=12, scale_to=4, rollout_timeout=180),
}


class CheckFailed(RuntimeError):
    pass


def watch_progress_trusted(version: str) -> bool:
    """kube-apiserver 1.37's rule (k8s.io/apiserver pkg/storage/feature):
    it sends RequestWatchProgress, and serves consistent reads from its
    watch cache, only to an etcd reporting 3.4.31 to 3.4.x or 3.5.13 and
    later (brain reports 3.7.3, brain/etcd_version.py)."""
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:[-+].*)?", version)
    if m is None:
        return False
    v = tuple(int(x) for x in m.groups())
    return (3, 4, 31) <= v < (3, 5, 0) or v >= (3, 5, 13)


def etcdctl_binary() -> str:
    """etcdctl for the checks that read a store as an operator does: $ETCDCTL, else the one on PATH
    (Debian's etcd-client, which make deps-system installs), else etcd 3.6's from benchmarks/build.sh."""
    found = os.environ.get("ETCDCTL") or shutil.which("etcdctl")
    if found:
        return found
    from tests.support.servers import etcd_binary

    etcd = etcd_binary("3.6")
    ctl = Path(etcd).with_name("etcdctl-3.6") if etcd else None
    if ctl is None or not ctl.is_file():
        raise CheckFailed("etcdctl is not installed (make deps-system) and etcd 3.6's is not built")
    return str(ctl)


def build(force: bool = False) -> Path:
    """Run build.sh; returns the cache directory (parent of bin/)."""
    argv = ["bash", str(HERE / "build.sh")] + (["--force"] if force else [])
    r = subprocess.run(argv, stdout=subprocess.PIPE, text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"tests/k8s/build.sh failed with exit code {r.returncode}")
    return Path(r.stdout.strip().splitlines()[-1]).parent


def _ts(s: str | None) -> float | None:
    if not s:
        return None
    return _dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


# ---------------------------------------------------------------------------
# kubectl get -w as a stream of events
# ---------------------------------------------------------------------------


class Watch:
    """``kubectl get <what> --watch --output-watch-events -o json`` in the
    background; events are collected as (type, name, resourceVersion).

    The apiserver may close a watch whose consumer falls behind (its watch
    cache logs "Forcing ... watcher close due to unresponsiveness"), and kubectl
    get -w then exits. Like an informer, the stream is then resumed from the
    last resourceVersion it delivered, through ``kubectl get --raw
    <raw_path>?watch=1&resourceVersion=RV``, so no event is lost or repeated;
    ``closes`` counts those resumptions.
    """

    def __init__(self, run: "Run", label: str, args: list[str], raw_path: str):
        self.run = run
        self.label = label
        self.raw_path = raw_path
        self.events: list[tuple[str, str, str]] = []
        self.closes = 0
        self.errors: list[str] = []
        self._last_rv = ""
        self._stopping = False
        self._cond = threading.Condition()
        self._stderr = open(run.workdir / f"watch-{label}.stderr", "ab")
        self.proc = self._spawn(["get", *args, "--watch", "--output-watch-events", "-o", "json"])
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _spawn(self, kubectl_args: list[str]) -> subprocess.Popen:
        return subprocess.Popen(self.run.kubectl_argv(kubectl_args), stdout=subprocess.PIPE, stderr=self._stderr,
                                stdin=subprocess.DEVNULL, text=True)

    def _read(self) -> None:
        while True:
            self._read_one(self.proc)
            self.proc.wait()
            with self._cond:
                if self._stopping:
                    self._cond.notify_all()
                    return
                self.closes += 1
                rv = self._last_rv
            self._stderr.write(f"--- watch closed (exit {self.proc.returncode}); resuming from "
                               f"resourceVersion {rv}\n".encode())
            self._stderr.flush()
            if not rv or self.closes > 20:
                with self._cond:
                    self.errors.append(f"cannot resume (rv {rv!r}, {self.closes} closes)")
                    self._cond.notify_all()
                return
            self.proc = self._spawn(["get", "--raw", f"{self.raw_path}?watch=1&resourceVersion={rv}"])

    def _read_one(self, proc: subprocess.Popen) -> None:
        # One compact JSON event per line (both for get -w -o json and for a
        # raw watch); should kubectl pretty-print, an event ends on a "}" line.
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if not line.rstrip().endswith("}"):
                continue
            try:
                ev = json.loads("".join(lines))
            except ValueError:
                continue
            lines = []
            typ = ev.get("type", "?")
            obj = ev.get("object") or {}
            meta = obj.get("metadata") or {}
            with self._cond:
                if typ == "ERROR":
                    self.errors.append(str(obj.get("message") or obj)[:300])
                else:
                    self._last_rv = meta.get("resourceVersion", self._last_rv)
                self.events.append((typ, meta.get("name", "?"), meta.get("resourceVersion", "")))
                self._cond.notify_all()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def wait_for(self, want: list[tuple[str, str]], timeout: float, start: int = 0) -> bool:
        """True once ``want`` (type, name) pairs have appeared in that order after index ``start``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                i = 0
                for typ, name, _rv in self.events[start:]:
                    if i < len(want) and (typ, name) == want[i]:
                        i += 1
                if i == len(want):
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(min(left, 1.0))

    def names(self, typ: str) -> set[str]:
        with self._cond:
            return {n for t, n, _rv in self.events if t == typ}

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with self._cond:
            for typ, _n, _rv in self.events:
                out[typ] = out.get(typ, 0) + 1
        return out

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._thread.join(10)
        self._stderr.close()


# ---------------------------------------------------------------------------
# one run
# ---------------------------------------------------------------------------


class ConfigMapWriter:
    """Creates ConfigMaps one after another through the apiserver (POST) in a
    thread, remembering every one it acknowledged (201) with its resourceVersion."""

    def __init__(self, run: "Run", namespace: str):
        self.run = run
        self.namespace = namespace
        self.acked: list[tuple[str, str]] = []
        self.acked_at: list[float] = []  # time.monotonic() of each acknowledgement
        self.refused = 0
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "ConfigMapWriter":
        self._thread.start()
        return self

    def _loop(self) -> None:
        i = 0
        path = f"/api/v1/namespaces/{self.namespace}/configmaps"
        while not self._stop.is_set():
            name = f"k-{i:06d}"
            i += 1
            code, body = self.run.cp.http_post_json(path, {"apiVersion": "v1", "kind": "ConfigMap",
                                                           "metadata": {"name": name}, "data": {"i": str(i)}})
            with self._cond:
                if code == 201:
                    self.acked.append((name, json.loads(body)["metadata"]["resourceVersion"]))
                    self.acked_at.append(time.monotonic())
                else:
                    self.refused += 1
                self._cond.notify_all()
            if code != 201:
                time.sleep(0.1)  # the storage is down: do not spin

    def wait_acked(self, n: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.acked) >= n, timeout)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


class Run:
    def __init__(self, args, cache: Path, transport: str, profile: Profile, workdir: Path,
                 backend: str = "brain", etcd_binary: Path | None = None):
        self.args = args
        self.backend = backend
        self.transport = transport
        self.p = profile
        self.workdir = workdir
        self.bindir = cache / "bin"
        self.kubectl_bin = os.environ.get("KUBECTL") or str(self.bindir / "kubectl")
        self.checks: list[tuple[str, bool, str]] = []
        self.facts: dict = {"transport": transport, "profile": profile.name}
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.timeout
        self.restart_windows: list[tuple[float, float]] = []  # wall clock
        self.restart_done_wall: float | None = None
        self.metrics_before_restart = None
        self.cp_started_wall = time.time()
        self.watches: list[Watch] = []
        self.writers: list[ConfigMapWriter] = []
        self.pki = make_cluster_pki(workdir / "pki", SERVICE_IP)
        if backend == "brain":
            self.store = Brain(workdir, transport, self.pki)
        elif backend == "brain-cluster":
            self.store = BrainCluster(workdir)
        elif backend == "brain-groups":
            self.store = BrainGroups(workdir)
        else:
            assert transport == "tcp" and etcd_binary is not None, "the etcd baseline runs over tcp"
            self.store = Etcd(workdir, etcd_binary)
        self.facts["storage"] = self.store.label
        self.cp = ControlPlane(self.bindir, workdir, self.pki, self.store, cache / "kwok-stages.yaml",
                               event_ttl=args.event_ttl, compaction_interval=args.compaction_interval)

    # -- reporting ----------------------------------------------------------
    def log(self, msg: str) -> None:
        print(f"[{self.name} {time.monotonic() - self.t0:7.1f}s] {msg}", flush=True)

    @property
    def name(self) -> str:
        return f"{self.transport}/{self.p.name}" + ("" if self.backend == "brain" else f"/{self.backend}")

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, bool(ok), detail))
        self.log(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
        return ok

    def require(self, name: str, ok: bool, detail: str = "") -> None:
        if not self.check(name, ok, detail):
            raise CheckFailed(f"{name}: {detail}")

    def time_left(self, want: float) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise CheckFailed(f"run deadline ({self.args.timeout:.0f}s) exceeded")
        return min(want, left)

    def wait_until(self, what: str, fn, timeout: float, interval: float = 1.0):
        """Call ``fn`` until it returns a truthy value; bounded by ``timeout``."""
        timeout = self.time_left(timeout)
        end = time.monotonic() + timeout
        last = None
        while True:
            for p in [*self.store.procs(), *self.cp.procs()]:
                if p.popen is not None:
                    p.check_alive()
            try:
                last = fn()
            except subprocess.CalledProcessError as e:
                last = f"kubectl failed: {e.stderr.strip()[-300:] if e.stderr else e}"
            else:
                if last and not isinstance(last, str):
                    return last
            if time.monotonic() >= end:
                raise CheckFailed(f"timed out after {timeout:.0f}s waiting for {what} (last: {str(last)[:300]})")
            time.sleep(interval)

    # -- kubectl --------------------------------------------------------------
    def kubectl_argv(self, args: list[str]) -> list[str]:
        return [self.kubectl_bin, f"--kubeconfig={self.cp.kubeconfig}",
                f"--cache-dir={self.workdir / 'kube-cache'}", *args]

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120.0) -> str:
        argv = self.kubectl_argv(list(args))
        r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=self.time_left(timeout))
        if r.returncode != 0:
            raise subprocess.CalledProcessError(r.returncode, argv, r.stdout, r.stderr)
        return r.stdout

    def kjson(self, *args: str, timeout: float = 120.0) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json", timeout=timeout))

    def create_items(self, items: list[dict], chunk: int, parallel: int) -> tuple[int, float]:
        """``kubectl create -f -`` of JSON Lists, ``parallel`` processes at a time."""
        chunks = [items[i:i + chunk] for i in range(0, len(items), chunk)]
        t0 = time.monotonic()
        created = 0
        running: list[tuple[subprocess.Popen, int]] = []
        throttled = 0

        def reap(p: subprocess.Popen, idx: int) -> None:
            nonlocal created, throttled
            out, err = p.communicate(timeout=self.time_left(300))
            if p.returncode != 0:
                raise CheckFailed(f"kubectl create (chunk {idx}) failed: {err.strip()[-800:]}")
            created += sum(1 for line in out.splitlines() if line.endswith(" created"))
            throttled += err.count("client-side throttling")

        for idx, c in enumerate(chunks):
            while len(running) >= parallel:
                p, i = running.pop(0)
                reap(p, i)
            p = subprocess.Popen(self.kubectl_argv(["create", "-f", "-"]), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            p.stdin.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": c}))
            p.stdin.close()
            p.stdin = None
            running.append((p, idx))
        for p, i in running:
            reap(p, i)
        if throttled:
            self.log(f"kubectl reported client-side throttling {throttled} times")
        return created, time.monotonic() - t0

    def names_rvs(self, *args: str) -> dict[str, str]:
        out = self.kubectl("get", *args, "-o",
                           "jsonpath={range .items[*]}{.metadata.name} {.metadata.resourceVersion}{\"\\n\"}{end}",
                           timeout=300)
        return dict(line.split(" ", 1) for line in out.splitlines() if line.strip())

    def pods(self, ns: str) -> list[dict]:
        return self.kjson("get", "pods", "-n", ns)["items"]

    def stored(self, resource: str, ns: str) -> int:
        """How many objects of ``resource`` in ``ns`` the storage itself holds
        (a count-only Range, not the apiserver's view)."""
        return self.store.count_prefix(f"/registry/{resource}/{ns}/".encode())[0]

    def kwok_nodes(self) -> set[str]:
        return {f"kwok-node-{i}" for i in range(self.p.nodes)}

    def metrics(self) -> list[promstats.Sample]:
        code, body = self.cp.http_get("/metrics", timeout=30)
        if code != 200:
            raise CheckFailed(f"/metrics answered {code}: {body[:300]}")
        return promstats.parse(body)

    # -- the scenario -----------------------------------------------------------
    def bring_up(self) -> None:
        self.log(f"work dir {self.workdir}")
        self.store.start()
        label = self.store.label
        try:
            version, db = self.store.status()
            self.facts["storage_version"] = version
            self.check(f"{label} Maintenance.Status reports an etcd version kube-apiserver trusts with watch progress",
                       watch_progress_trusted(version), f"version {version!r}, dbSize {db}")
        except Exception as e:  # noqa: BLE001 - reported
            code = getattr(e, "code", lambda: None)()
            self.facts["storage_version"] = f"Status failed: {code}"
            self.check(f"{label} Maintenance.Status reports an etcd version kube-apiserver trusts with watch progress",
                       False,
                       f"Status not served ({code}): the apiserver will treat RequestWatchProgress as unsupported")
        self.cp_started_wall = time.time()
        took = self.cp.start(timeout=self.time_left(180))
        self.facts["control_plane_start_s"] = round(took, 1)
        code, body = self.cp.http_get("/readyz?verbose")
        self.require("/readyz green with the etcd checks", code == 200 and "[+]etcd ok" in body
                     and "[+]etcd-readiness ok" in body, f"HTTP {code}")
        ver = self.kjson("version")
        server_version = ver.get("serverVersion", {}).get("gitVersion")
        self.facts["kubernetes_version"] = server_version
        self.check("apiserver reports the pinned version", server_version == self.args.k8s_version,
                   f"{server_version}")

    def make_nodes(self) -> None:
        n = self.p.nodes
        items = [{
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"kwok-node-{i}", "labels": {"type": "kwok", "kubernetes.io/hostname": f"kwok-node-{i}"},
                         "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                       "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}},
        } for i in range(n)]
        created, _ = self.create_items(items, chunk=n, parallel=1)
        t0 = time.monotonic()

        def ready():
            nodes = self.kjson("get", "nodes")["items"]
            good = [x for x in nodes if any(c["type"] == "Ready" and c["status"] == "True"
                                            for c in x.get("status", {}).get("conditions", []))
                    and not any(t.get("key") == "node.kubernetes.io/not-ready" for t in x["spec"].get("taints", []))]
            return len(good) >= n or f"{len(good)}/{n} ready"

        self.wait_until("kwok nodes Ready and untainted", ready, 120)
        self.check(f"{n} kwok nodes Ready", created == n, f"in {time.monotonic() - t0:.1f}s")

    def namespaces(self) -> None:
        for ns in ("e2e-cm", "e2e-crd", "e2e-apps", "e2e-watch"):
            self.kubectl("create", "namespace", ns)
        self.facts["namespaces"] = 4

    def start_watches(self) -> None:
        self.cm_watch = Watch(self, "configmaps", ["configmaps", "-n", "e2e-watch"],
                              "/api/v1/namespaces/e2e-watch/configmaps")
        self.pod_watch = Watch(self, "pods", ["pods", "-n", "e2e-apps"], "/api/v1/namespaces/e2e-apps/pods")
        self.watches += [self.cm_watch, self.pod_watch]
        mark = len(self.cm_watch.events)
        time.sleep(1.0)
        self.kubectl("create", "configmap", "w1", "-n", "e2e-watch", "--from-literal=k=v1")
        self.kubectl("patch", "configmap", "w1", "-n", "e2e-watch", "--type=merge", "-p", '{"data":{"k":"v2"}}')
        self.kubectl("delete", "configmap", "w1", "-n", "e2e-watch")
        ok = self.cm_watch.wait_for([("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")], 30, mark)
        self.require("kubectl get -w sees ADDED, MODIFIED, DELETED in order", ok,
                     f"events {self.cm_watch.events[mark:][:10]}")

    def configmaps(self) -> None:
        n, chunk = self.p.configmaps, self.p.list_chunk
        payload = "x" * 512
        items = [{"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": f"cm-{i:05d}", "namespace": "e2e-cm", "labels": {"e2e": "bulk"}},
                  "data": {"index": str(i), "payload": payload}} for i in range(n)]
        created, took = self.create_items(items, self.p.create_chunk, self.p.parallel)
        self.facts["configmaps_created"] = created
        self.facts["configmaps_create_s"] = round(took, 1)
        self.facts["configmaps_per_s"] = round(created / took, 1) if took else None
        self.require(f"{n} ConfigMaps created", created == n,
                     f"{created} in {took:.1f}s ({created / took:.0f}/s, {self.p.parallel} parallel kubectl)")
        # Paged list: kubectl -v=6 logs each GET, so the pages can be counted.
        r = subprocess.run(self.kubectl_argv(["get", "configmaps", "-n", "e2e-cm", "-l", "e2e=bulk",
                                              f"--chunk-size={chunk}", "-o", "name", "-v=6"]),
                           capture_output=True, text=True, timeout=self.time_left(300))
        names = [x for x in r.stdout.splitlines() if x.startswith("configmap/")]
        pages = len(re.findall(r'verb="GET" url="https://[^"]+/configmaps\?[^"]*limit=%d\b' % chunk, r.stderr))
        self.facts["configmap_list_pages"] = pages
        want_pages = -(-n // chunk)
        self.require(f"--chunk-size={chunk} list counts {n}", r.returncode == 0 and len(names) == n
                     and len(set(names)) == n, f"{len(names)} names in {pages} pages (expected {want_pages})")
        self.check("the list was paged", pages >= want_pages, f"{pages} pages")
        prefix = b"/registry/configmaps/e2e-cm/"
        rev, keys = self.store.snapshot(prefix)
        stored = {k[len(prefix):].decode() for k in keys}
        # Exactly the n ConfigMaps, plus kube-root-ca.crt once kube-controller-manager
        # has published it (it does so in every namespace).
        want = {f"cm-{i:05d}" for i in range(n)}
        self.check(f"{self.store.label} holds exactly the ConfigMaps", stored - {"kube-root-ca.crt"} == want,
                   f"{len(stored)} keys at revision {rev} ({len(want - stored)} missing, "
                   f"{len(stored - want - {'kube-root-ca.crt'})} unexpected)")

    def crd(self) -> None:
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"widgets.{CRD_GROUP}"},
            "spec": {
                "group": CRD_GROUP, "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "versions": [{
                    "name": "v1", "served": True, "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {
                            "size": {"type": "integer"}, "color": {"type": "string"}}},
                        "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}}},
                }],
            },
        }
        self.kubectl("create", "-f", "-", stdin=json.dumps(crd))
        # kubectl wait fails at once ("status.conditions accessor error") on a
        # CRD whose conditions are still null, before the apiextensions
        # controller's first status write; wait for that write first.
        deadline = time.monotonic() + 60
        while not self.kjson("get", f"crd/widgets.{CRD_GROUP}").get("status", {}).get("conditions"):
            if time.monotonic() > deadline:
                raise CheckFailed(f"crd/widgets.{CRD_GROUP} has no status conditions after 60 s")
            time.sleep(0.2)
        self.kubectl("wait", "--for=condition=Established", f"crd/widgets.{CRD_GROUP}", "--timeout=60s", timeout=90)
        n = self.p.widgets
        items = [{"apiVersion": f"{CRD_GROUP}/v1", "kind": "Widget",
                  "metadata": {"name": f"w-{i:04d}", "namespace": "e2e-crd"},
                  "spec": {"size": i, "color": "blue"}} for i in range(n)]

        def create():
            try:
                return self.create_items(items, max(1, n // 2), 2)
            except CheckFailed as e:  # discovery can lag the Established condition by a moment
                return str(e)

        created, took = self.wait_until("Widget creation", create, 60, interval=2)
        self.facts["widgets_created"] = created
        got = self.names_rvs("widgets", "-n", "e2e-crd", f"--chunk-size={max(1, self.p.list_chunk // 5)}")
        self.require(f"{n} Widgets created and listed", created == n and len(got) == n, f"{len(got)} listed")
        self.kubectl("patch", "widget", "w-0001", "-n", "e2e-crd", "--type=merge", "-p", '{"spec":{"color":"red"}}')
        w = self.kjson("get", "widget", "w-0001", "-n", "e2e-crd")
        self.require("Widget patch reads back", w["spec"]["color"] == "red" and w["spec"]["size"] == 1)
        self.kubectl("patch", "widget", "w-0001", "-n", "e2e-crd", "--subresource=status", "--type=merge",
                     "-p", '{"status":{"phase":"Ready"}}')
        w = self.kjson("get", "widget", "w-0001", "-n", "e2e-crd")
        self.check("Widget status subresource update", w.get("status", {}).get("phase") == "Ready")
        doomed = [f"w-{i:04d}" for i in range(0, n, 5)]
        self.kubectl("delete", "widget", "-n", "e2e-crd", "--wait=false", *doomed, timeout=180)
        left = self.names_rvs("widgets", "-n", "e2e-crd")
        stored, _ = self.store.count_prefix(f"/registry/{CRD_GROUP}/widgets/e2e-crd/".encode())
        self.require("Widget deletes", len(left) == n - len(doomed) and stored == len(left),
                     f"{len(left)} listed, {stored} stored")

    def deployment(self) -> None:
        r = self.p.replicas
        dep = {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "e2e-apps"},
            "spec": {
                "replicas": r,
                "selector": {"matchLabels": {"app": "web"}},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [{"name": "web", "image": "fake.invalid/web:1",
                                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
                        "terminationGracePeriodSeconds": 0,
                    },
                },
            },
        }
        t0 = time.monotonic()
        self.kubectl("create", "-f", "-", stdin=json.dumps(dep))

        def all_running():
            pods = self.pods("e2e-apps")
            running = [p for p in pods if p["status"].get("phase") == "Running"
                       and not p["metadata"].get("deletionTimestamp")]
            return (len(running) == r and len(pods) == r and pods) or f"{len(running)}/{r} Running of {len(pods)}"

        pods = self.wait_until(f"{r} pods Running", all_running, self.p.rollout_timeout, interval=1.0)
        took = time.monotonic() - t0
        self.facts["pods_running_s"] = round(took, 1)
        startup = []
        for p in pods:
            ready = [c for c in p["status"].get("conditions", []) if c["type"] == "Ready" and c["status"] == "True"]
            if ready:
                startup.append(_ts(ready[0]["lastTransitionTime"]) - _ts(p["metadata"]["creationTimestamp"]))
        nodes = {p["spec"].get("nodeName") for p in pods}
        self.facts["pod_startup_p50_s"] = _pct(startup, 0.5)
        self.facts["pod_startup_p99_s"] = _pct(startup, 0.99)
        self.kubectl("rollout", "status", "deployment/web", "-n", "e2e-apps", "--timeout=120s", timeout=150)
        status = self.kjson("get", "deployment", "web", "-n", "e2e-apps").get("status", {})
        stored = self.stored("pods", "e2e-apps")
        strays = sorted(str(n) for n in nodes - self.kwok_nodes())
        self.check(f"Deployment of {r} replicas fully Running on kwok nodes",
                   not strays and status.get("updatedReplicas") == r and status.get("availableReplicas") == r
                   and stored == r,
                   f"{took:.1f}s to all Running, spread over {len(nodes)} nodes"
                   + (f" (not kwok nodes: {strays[:3]})" if strays else "")
                   + f", Deployment status {status.get('updatedReplicas')} updated / "
                   f"{status.get('availableReplicas')} available, {stored} pods stored, pod startup "
                   f"p50 {self.facts['pod_startup_p50_s']}s p99 {self.facts['pod_startup_p99_s']}s "
                   f"(SLO p99 <= 5s, 1 s timestamp resolution)")

    def object_lists(self) -> dict[str, dict[str, str]]:
        return {
            "configmaps": self.names_rvs("configmaps", "-n", "e2e-cm", "-l", "e2e=bulk"),
            "widgets": self.names_rvs("widgets", "-n", "e2e-crd"),
            "deployments": self.names_rvs("deployments", "-n", "e2e-apps"),
        }

    def restart_storage(self, how: str) -> None:
        """Stop the storage server (SIGTERM, or kill -9 while ConfigMaps are being
        created through the apiserver), start it on the same data dir, and check
        nothing was lost or changed.

        Exact: the keyspace at R, the revision read just before the stop, must be
        identical after the restart (every key with its value, create and mod
        revision and version).  At the head, keys may legitimately differ only by
        writes after R (the control plane keeps writing: events, leases, node and
        pod status, and the ConfigMaps of the kill -9 writer); every key that
        differs must carry a mod_revision above R."""
        label = self.store.label
        before = self.object_lists()
        pod_names = set(self.names_rvs("pods", "-n", "e2e-apps"))
        if self.metrics_before_restart is None:
            self.metrics_before_restart = self.metrics()
        cm_mark = len(self.cm_watch.events)
        writer = None
        if how == "kill9":
            self.kubectl("create", "namespace", "e2e-kill")
            writer = ConfigMapWriter(self, "e2e-kill").start()
            self.writers.append(writer)
            self.require("ConfigMaps being created before the kill", writer.wait_acked(20, self.time_left(60)),
                         f"{len(writer.acked)} acknowledged")
        rev, snap = self.store.snapshot(b"/registry/")
        self.log(f"{'kill -9 of' if how == 'kill9' else 'restarting'} {label} with {len(snap)} keys at "
                 f"revision {rev}" + (f", {len(writer.acked)} ConfigMaps acknowledged so far" if writer else ""))
        w0 = time.time()
        t0 = time.monotonic()
        if how == "kill9":
            code = self.store.kill9()
            self.check(f"{label} killed with SIGKILL", code == -9, f"exit status {code}")
        else:
            code = self.store.stop(30)
            stopped = time.monotonic() - t0
            self.facts["storage_stop_s"] = round(stopped, 1)
            # etcd re-raises SIGTERM after its shutdown handlers, so it ends "killed by SIGTERM".
            clean = code == 0 or (self.backend != "brain" and code == -15)
            self.check(f"{label} exits cleanly on SIGTERM", clean, f"exit code {code} after {stopped:.1f}s")
        # The apiserver must notice: its etcd readiness check goes red.
        red = False
        for _ in range(40):
            c, body = self.cp.http_get("/readyz?verbose", timeout=5)
            if c != 200:
                red = "[-]etcd" in body
                break
            time.sleep(0.25)
        self.check(f"apiserver /readyz reports etcd down while {label} is down ({how})", red)
        t1 = time.monotonic()
        self.store.start(timeout=self.time_left(90))
        serving = time.monotonic() - t1
        # First, before anything else can compact it: the keyspace at R.
        try:
            _, again = self.store.snapshot(b"/registry/", revision=rev)
            lost = sorted(set(snap) - set(again))
            extra = sorted(set(again) - set(snap))
            changed = sorted(k for k in snap if k in again and again[k] != snap[k])
            detail = (f"{len(again)} keys at revision {rev} (before: {len(snap)}); {len(lost)} lost, "
                      f"{len(extra)} extra, {len(changed)} changed" + (f": {(lost + extra + changed)[:5]}"
                                                                     if lost or extra or changed else ""))
            self.check(f"{how}: the keyspace at revision {rev} is identical after the restart",
                       not lost and not extra and not changed, detail)
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            self.check(f"{how}: the keyspace at revision {rev} is identical after the restart", False, repr(e))
        waited, body = self.cp.wait_readyz(self.time_left(120))
        recovered = time.monotonic() - t1
        self.restart_done_wall = time.time()
        self.restart_windows.append((w0, time.time() + 30))
        self.facts[f"storage_{how}_start_s"] = round(serving, 1)
        self.facts[f"storage_{how}_recovery_s"] = round(recovered, 1)
        self.check(f"apiserver /readyz green again after the {label} restart ({how})", "[+]etcd ok" in body,
                   f"{label} serving {serving:.1f}s after start, apiserver green {recovered:.1f}s after start "
                   f"(down for {time.monotonic() - t0:.1f}s in all)")
        if writer is not None:
            n = len(writer.acked)
            resumed = writer.wait_acked(n + 10, self.time_left(60))
            writer.stop()
            acked = dict(writer.acked)
            there = self.names_rvs("configmaps", "-n", "e2e-kill")
            missing = [k for k in acked if k not in there]
            moved = [k for k in acked if k in there and there[k] != acked[k]]
            self.facts["kill9_configmaps_acknowledged"] = len(acked)
            self.facts["kill9_configmap_posts_refused"] = writer.refused
            self.check("every ConfigMap acknowledged across the kill -9 is there at its resourceVersion",
                       resumed and not missing and not moved,
                       f"{len(acked)} acknowledged ({n} before the apiserver was green again), {writer.refused} "
                       f"refused while down, {len(missing)} missing, {len(moved)} with another resourceVersion")
        head, now = self.store.snapshot(b"/registry/")
        differ = [k for k in now if now[k] != snap.get(k)]
        older = [k for k in differ if now[k][1] <= rev]
        gone = [k for k in snap if k not in now]
        by_kind: dict[str, int] = {}
        for k in differ + gone:
            kind = "/".join(k.decode(errors="replace").split("/")[2:3])
            by_kind[kind] = by_kind.get(kind, 0) + 1
        self.check(f"{how}: every key that differs at the head was written after revision {rev}", not older,
                   f"{len(now)} keys at revision {head}: {len(differ)} new or changed, {len(gone)} deleted since "
                   f"{rev}, by resource {dict(sorted(by_kind.items()))}" + (f"; older: {older[:5]}" if older else ""))
        after = self.wait_until("lists after restart", self.object_lists, 60)
        for kind in ("configmaps", "widgets", "deployments"):
            lost = set(before[kind]) - set(after[kind])
            changed = [k for k in before[kind] if k in after[kind] and after[kind][k] != before[kind][k]]
            self.check(f"{how}: no {kind} lost or changed", not lost and not changed and before[kind],
                       f"{len(after[kind])} present, {len(lost)} lost, {len(changed)} with another resourceVersion")
        pods_after = set(self.names_rvs("pods", "-n", "e2e-apps"))
        self.check(f"{how}: no pods lost", pod_names <= pods_after,
                   f"{len(pod_names & pods_after)}/{len(pod_names)} still there")
        # A write after the restart, seen by the watch opened before it.
        name = f"after-{how}"
        self.kubectl("create", "configmap", name, "-n", "e2e-watch", "--from-literal=k=v")
        ok = self.cm_watch.wait_for([("ADDED", name)], 30, cm_mark)
        self.check(f"{how}: a kubectl get -w opened before the restart still delivers",
                   ok and self.cm_watch.closes == 0, f"closed and resumed {self.cm_watch.closes} times")

    def cut_cluster_follower(self) -> None:
        """A brain follower cut off from every nats-server while
        kube-apiserver still reaches it (issue 18): the apiserver's watches
        carry etcd's require-leader metadata, so the replica cancels them
        ("etcdserver: no leader") after three election timeouts and refuses
        new ones; the apiserver opens them again on the other replicas.  A
        watch opened before the cut keeps delivering, `kubectl get` never
        answers an older value than the one just written, and the replica
        catches up once the links heal."""
        store = self.store
        lead = store.leader()
        self.require("the brain cluster names one leader before the cut", lead is not None)

        def streams(r):
            return store.metric(r, "brain_require_leader_streams")

        before = {r.name: streams(r) for r in store.procs()}
        # the follower holding the most of the apiserver's watch streams (a
        # replica restarted earlier in the run may hold none: gRPC keeps a
        # stream on the connection it started on)
        cut = max((r for r in store.procs() if r is not lead), key=lambda r: before[r.name])
        others = [r for r in store.procs() if r is not cut]
        self.require("the apiserver watches through a follower before the cut", before[cut.name] > 0,
                     f"require-leader streams per replica {before}")
        cm_mark = len(self.cm_watch.events)
        self.kubectl("create", "namespace", "e2e-cut")
        self.kubectl("create", "configmap", "probe", "-n", "e2e-cut", "--from-literal=v=0")
        w0 = time.time()
        t0 = time.monotonic()
        store.cut_from_nats(cut)
        self.log(f"{cut.name} cut from every nats-server ({before[cut.name]} require-leader streams on it)")

        def cut_holds_no_stream():
            n = streams(cut)
            return time.monotonic() - t0 if n == 0 else f"{n} streams"

        emptied = self.wait_until(f"the streams on {cut.name} ended", cut_holds_no_stream, 60, interval=0.25)
        ended = store.metric(cut, "brain_require_leader_streams_ended_total")
        self.facts["cluster_cut_watches_moved_s"] = round(emptied, 2)
        self.check("require-leader: the apiserver's watch streams on the cut-off replica end and stay off it",
                   emptied < 30 and ended >= before[cut.name],
                   f"{before[cut.name]} streams on {cut.name} gone {emptied:.1f}s after the cut, {ended} ended "
                   "with 'etcdserver: no leader'")
        refused: list[str] = []

        def during_cut(*args: str) -> str:
            """kubectl while the replica is cut off: a call the apiserver sent
            to it fails with etcd's timeout, its outcome unknown (as on an
            etcd member cut from its peers); tried again, as a controller
            would (the patches set a value, so a repeat is harmless)."""
            for attempt in range(6):
                try:
                    return self.kubectl(*args, timeout=60)
                except subprocess.CalledProcessError as e:
                    err = e.stderr or ""
                    if attempt and "AlreadyExists" in err:
                        return ""  # an earlier attempt's create did land
                    if attempt == 5 or not any(t in err for t in ("request timed out", "no leader",
                                                                   "leader changed")):
                        raise
                    refused.append(err.strip()[-160:])
            raise AssertionError("unreachable")

        stale = []
        for i in range(1, 6):
            during_cut("patch", "configmap", "probe", "-n", "e2e-cut", "--type=merge", "-p",
                       json.dumps({"data": {"v": str(i)}}))
            got = during_cut("get", "configmap", "probe", "-n", "e2e-cut", "-o", "jsonpath={.data.v}")
            listed = json.loads(during_cut("get", "configmaps", "-n", "e2e-cut", "-o", "json"))["items"]
            seen = [c["data"]["v"] for c in listed if c["metadata"]["name"] == "probe"]
            if got != str(i) or seen != [str(i)]:
                stale.append((i, got, seen))
        self.check("kubectl get and list during the cut return every value just written, never an older one",
                   not stale, (f"stale answers {stale}" if stale else "5 writes, each read back by get and list")
                   + f"; {len(refused)} calls timed out on the cut-off replica and were tried again"
                   + (f", e.g. {refused[0]!r}" if refused else ""))
        name = "during-cut"
        during_cut("create", "configmap", name, "-n", "e2e-watch", "--from-literal=k=v")
        ok = self.cm_watch.wait_for([("ADDED", name)], 30, cm_mark)
        self.check("a kubectl get -w opened before the cut still delivers during it", ok)
        after = {r.name: streams(r) for r in others}
        self.check("the watch streams moved to the replicas that have a leader",
                   sum(after.values()) >= sum(before[r.name] for r in others) + before[cut.name] // 2,
                   f"before {before}, during the cut {after}")
        store.heal()
        probe_rv = self.kjson("get", "configmap", "probe", "-n", "e2e-cut", timeout=60)["metadata"]["resourceVersion"]

        def caught_up():
            try:
                rev = store.read_revision(cut)
            except Exception as e:  # noqa: BLE001 - not serving yet: asked again
                return f"{e!r}"[:200]
            return rev if rev >= int(probe_rv) else f"at revision {rev}, below {probe_rv}"

        caught = self.wait_until(f"{cut.name} caught up after the heal", caught_up, 60, interval=0.5)
        self.check("the cut-off replica serves linearizable reads again after the heal", bool(caught),
                   f"{cut.name} at revision {caught} ({time.monotonic() - t0:.1f}s after the cut)")
        # the apiserver's writes that reached the cut-off replica timed out
        # ("etcdserver: request timed out", as on an etcd member cut from its
        # peers): its log is judged as around a restart
        self.restart_windows.append((w0, time.time() + 10))
        self.log(f"{cut.name}: watches gone {emptied:.1f}s after the cut, healed and caught up")

    def kill_cluster_leader(self) -> None:
        """A brain cluster loses its leader: kill -9 of the leading replica
        under the live apiserver while ConfigMaps are being created.  The
        other replicas take over; nothing acknowledged may be lost, the
        keyspace at the revision read before the kill must be identical,
        the apiserver must be healthy again, and the time it took is
        reported (the killed replica then rejoins and catches up)."""
        store = self.store
        before = self.object_lists()
        pod_names = set(self.names_rvs("pods", "-n", "e2e-apps"))
        self.metrics_before_restart = self.metrics()
        cm_mark = len(self.cm_watch.events)
        self.kubectl("create", "namespace", "e2e-kill")
        writer = ConfigMapWriter(self, "e2e-kill").start()
        self.writers.append(writer)
        self.require("ConfigMaps being created before the kill", writer.wait_acked(20, self.time_left(60)),
                     f"{len(writer.acked)} acknowledged")
        lead = store.leader()
        self.require("the brain cluster names one leader", lead is not None)
        rev, snap = store.snapshot(b"/registry/")
        self.log(f"kill -9 of the brain leader {lead.name} with {len(snap)} keys at revision {rev}, "
                 f"{len(writer.acked)} ConfigMaps acknowledged so far")
        w0 = time.time()
        t0 = time.monotonic()
        n_before = len(writer.acked)
        code = store.kill_replica(lead)
        self.check("brain leader killed with SIGKILL", code == -9, f"exit status {code}")
        def new_leader():
            m = store.leader()
            return m if m not in (None, lead) else None

        new = self.wait_until("a new brain leader", new_leader, self.time_left(30), interval=0.1)
        elected = time.monotonic() - t0
        # before waiting for the writer: its one POST at a time may be the
        # write in flight to the killed leader, which times out
        waited, body = self.cp.wait_readyz(self.time_left(60))
        healthy = time.monotonic() - t0
        self.facts["cluster_apiserver_healthy_s"] = round(healthy, 2)
        self.check("apiserver /readyz green after the leader's kill", "[+]etcd ok" in body,
                   f"green {healthy:.1f}s after the kill")
        resumed = writer.wait_acked(n_before + 10, self.time_left(60))
        after_kill = [t for t in writer.acked_at[n_before:] if t > t0]
        pause = (after_kill[0] - t0) if after_kill else None
        self.facts["cluster_new_leader_s"] = round(elected, 2)
        self.facts["cluster_write_pause_s"] = pause and round(pause, 2)
        self.check("ConfigMaps are created again after the leader's kill", resumed and pause is not None,
                   f"a new leader after {elected:.2f}s, the first ConfigMap acknowledged {pause and round(pause, 2)}s "
                   f"after the kill, {writer.refused} POSTs refused meanwhile")
        try:
            _, again = store.snapshot(b"/registry/", revision=rev)
            lost = sorted(set(snap) - set(again))
            extra = sorted(set(again) - set(snap))
            changed = sorted(k for k in snap if k in again and again[k] != snap[k])
            self.check(f"leader kill: the keyspace at revision {rev} is identical on the other replicas",
                       not lost and not extra and not changed,
                       f"{len(again)} keys (before: {len(snap)}); {len(lost)} lost, {len(extra)} extra, "
                       f"{len(changed)} changed")
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            self.check(f"leader kill: the keyspace at revision {rev} is identical on the other replicas", False,
                       repr(e))
        self.restart_windows.append((w0, time.time() + 30))
        self.restart_done_wall = time.time()
        rejoin = store.restart(lead, timeout=self.time_left(60))
        self.facts["cluster_rejoin_s"] = round(rejoin, 1)
        self.log(f"new leader {new.name} after {elected:.2f}s; write pause {pause and round(pause, 2)}s; "
                 f"{lead.name} rejoined in {rejoin:.1f}s")
        n = len(writer.acked)
        writer.wait_acked(n + 5, self.time_left(30))
        writer.stop()
        there = self.names_rvs("configmaps", "-n", "e2e-kill")
        missing = [k for k, _ in writer.acked if k not in there]
        moved = [k for k, v in writer.acked if k in there and there[k] != v]
        self.facts["kill9_configmaps_acknowledged"] = len(writer.acked)
        self.check("every ConfigMap acknowledged across the leader's kill is there at its resourceVersion",
                   not missing and not moved,
                   f"{len(writer.acked)} acknowledged, {len(missing)} missing, {len(moved)} moved")
        after = self.wait_until("lists after the leader's kill", self.object_lists, 60)
        for kind in ("configmaps", "widgets", "deployments"):
            lost = set(before[kind]) - set(after[kind])
            changed = [k for k in before[kind] if k in after[kind] and after[kind][k] != before[kind][k]]
            self.check(f"leader kill: no {kind} lost or changed", not lost and not changed and before[kind],
                       f"{len(after[kind])} present, {len(lost)} lost, {len(changed)} changed")
        self.check("leader kill: no pods lost", pod_names <= set(self.names_rvs("pods", "-n", "e2e-apps")))
        self.kubectl("create", "configmap", "after-leader-kill", "-n", "e2e-watch", "--from-literal=k=v")
        ok = self.cm_watch.wait_for([("ADDED", "after-leader-kill")], 30, cm_mark)
        self.check("leader kill: a kubectl get -w opened before the kill still delivers", ok)

    # -- brain groups: Leases and Events in a group of their own ------------------
    def etcdctl_keys(self, group: str, prefix: str) -> list[str]:
        """``etcdctl get PREFIX --prefix --keys-only`` against one group's endpoint, as an operator runs it."""
        argv = [etcdctl_binary(), "--endpoints", self.store.group(group).url, "get", prefix, "--prefix",
                "--keys-only"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=self.time_left(60),
                           env={**os.environ, "ETCDCTL_API": "3"})
        if r.returncode != 0:
            raise CheckFailed(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()[-300:]}")
        return [line for line in r.stdout.splitlines() if line]

    def groups_keyspaces(self) -> None:
        """Every node Lease and Event in the leases-events group's keyspace and none in the main group's;
        nothing else in the leases-events group; kube-apiserver checks that group as an override."""
        st = self.store
        main, moved = st.MAIN, st.MOVED
        leases = {g: self.etcdctl_keys(g, "/registry/leases/") for g in (main, moved)}
        node_leases = {k.rsplit("/", 1)[1] for k in leases[moved] if k.startswith("/registry/leases/kube-node-lease/")}
        self.check("node Leases are in the leases-events group's keyspace and nowhere else (etcdctl get --prefix)",
                   self.kwok_nodes() <= node_leases and not leases[main],
                   f"{len(leases[moved])} Leases in {moved} ({len(node_leases)} node Leases), "
                   f"{len(leases[main])} in {main}")
        events = {g: self.etcdctl_keys(g, "/registry/events/") for g in (main, moved)}
        self.check("Events are in the leases-events group's keyspace and nowhere else (etcdctl get --prefix)",
                   bool(events[moved]) and not events[main],
                   f"{len(events[moved])} Events in {moved}, {len(events[main])} in {main}")
        every = self.etcdctl_keys(moved, "")
        other = [k for k in every if not k.startswith(("/registry/leases/", "/registry/events/"))
                 and k != "compact_rev_key"]
        rest = {kind: len(self.etcdctl_keys(main, f"/registry/{kind}/")) for kind in ("pods", "minions", "configmaps")}
        self.facts["groups_keys"] = {moved: len(every), f"{main} pods/nodes/configmaps": rest}
        self.check("the leases-events group holds nothing else, the main group the rest (pods, nodes, ConfigMaps)",
                   not other and all(rest.values()),
                   f"{len(every)} keys in {moved}, {len(other)} of them outside Leases and Events"
                   + (f": {other[:5]}" if other else "") + f"; {main} holds {rest}")
        code, body = self.cp.http_get("/readyz?verbose")
        self.check("kube-apiserver took the override: /readyz checks the leases-events group on its own",
                   code == 200 and "[+]etcd-override-0 ok" in body and "[+]etcd-override-readiness-0 ok" in body,
                   f"HTTP {code}; apiserver flags {' '.join(st.apiserver_flags())}")

    def groups_resource_versions(self) -> None:
        """Each group's resourceVersions are its own: an object's resourceVersion is its key's mod
        revision in its own group, whose revision sequence counts only that group's writes."""
        from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc

        st = self.store

        def current(group: str, key: bytes):
            with st.group(group).channel() as ch:
                resp = rpc_pb2_grpc.KVStub(ch).Range(rpc_pb2.RangeRequest(key=key), timeout=10)
            return resp.kvs[0].mod_revision if resp.kvs else None, resp.header.revision

        events = self.kjson("get", "events", "-n", "e2e-apps")["items"]
        self.require("kubectl get events lists the Deployment's Events", bool(events), f"{len(events)} Events")
        event = max(events, key=lambda e: int(e["metadata"]["resourceVersion"]))
        pod = self.pods("e2e-apps")[0]
        objects = [
            ("a node Lease", st.MOVED, ["lease", "kwok-node-0", "-n", "kube-node-lease"],
             b"/registry/leases/kube-node-lease/kwok-node-0"),
            ("an Event", st.MOVED, ["event", event["metadata"]["name"], "-n", "e2e-apps"],
             f"/registry/events/e2e-apps/{event['metadata']['name']}".encode()),
            ("a pod", st.MAIN, ["pod", pod["metadata"]["name"], "-n", "e2e-apps"],
             f"/registry/pods/e2e-apps/{pod['metadata']['name']}".encode()),
        ]
        heads = {}
        for what, group, kubectl_args, key in objects:
            other = st.MAIN if group == st.MOVED else st.MOVED
            for _ in range(10):  # a Lease renewed between the two reads is read again
                rv = int(self.kjson("get", *kubectl_args)["metadata"]["resourceVersion"])
                mod, heads[group] = current(group, key)
                if mod == rv:
                    break
                time.sleep(0.5)
            elsewhere, heads[other] = current(other, key)
            self.check(f"{what}'s resourceVersion is its key's mod revision in the {group} group, not in the other",
                       mod == rv and elsewhere is None,
                       f"resourceVersion {rv}; {key.decode()} at mod revision {mod} in {group} (head {heads[group]}),"
                       f" {'absent' if elsewhere is None else f'at {elsewhere}'} in {other} (head {heads[other]})")
        self.facts["groups_head_revisions"] = heads

    def kill_moved_group(self) -> None:
        """kill -9 of the leases-events group's brain under the live apiserver: `brain groups` reports it and
        starts it again on its data dir, its keyspace at the revision read before is identical after, the
        apiserver is green again and kwok's node Leases are renewed in it again."""
        st = self.store
        group = st.group(st.MOVED)
        key = b"/registry/leases/kube-node-lease/kwok-node-0"
        self.metrics_before_restart = self.metrics()
        rev, snap = group.snapshot(b"/registry/")
        lease_before = snap[key][1]
        pid = st.group_pid(st.MOVED)
        self.log(f"kill -9 of group {st.MOVED} (pid {pid}) with {len(snap)} keys at revision {rev}")
        marker = len(st.log())
        w0 = time.time()
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)

        def restarted():
            text = st.log()[marker:]
            done = f"pid {pid}) was killed by SIGKILL" in text and f"{st.MOVED} serves again" in text
            return text.splitlines() if done else f"not yet: {text.strip()[-300:]!r}"

        lines = self.wait_until(f"brain groups restarting {st.MOVED}", restarted, 60, interval=0.25)
        back = time.monotonic() - t0
        new_pid = st.group_pid(st.MOVED)
        self.facts["groups_restart_s"] = round(back, 1)
        self.check("brain groups reports the killed group and starts it again; the other group serves on",
                   new_pid != pid and st.proc.alive and not any("stopping" in line for line in lines),
                   f"pid {pid} killed, {st.MOVED} serving again as pid {new_pid} {back:.1f}s later: "
                   + " | ".join(line.strip() for line in lines[:4]))
        try:
            _, again = group.snapshot(b"/registry/", revision=rev)
            changed = sorted(k for k in set(snap) | set(again) if snap.get(k) != again.get(k))
            self.check(f"group kill: the leases-events keyspace at revision {rev} is identical after the restart",
                       not changed, f"{len(again)} keys (before: {len(snap)}), {len(changed)} differ"
                       + (f": {changed[:3]}" if changed else ""))
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            self.check(f"group kill: the leases-events keyspace at revision {rev} is identical after the restart",
                       False, repr(e))
        waited, body = self.cp.wait_readyz(self.time_left(120))
        self.check("apiserver /readyz green again after the group's kill", "[+]etcd-override-0 ok" in body,
                   f"green {time.monotonic() - t0:.1f}s after the kill")

        def renewed():
            rev_now, now = group.snapshot(key)
            mod = now.get(key, (0, 0))[1]
            return mod if mod > rev else f"mod revision {mod} (before the kill {lease_before}, kill at {rev})"

        mod = self.wait_until("kwok's node Lease renewed in the restarted group", renewed, 60, interval=0.5)
        self.check("node Leases are renewed in the restarted group", mod > rev,
                   f"kwok-node-0's Lease at mod revision {lease_before} before the kill, {mod} after")
        self.restart_windows.append((w0, time.time() + 30))
        self.restart_done_wall = time.time()

    def groups_compaction(self) -> None:
        """kube-apiserver compacts the leases-events group on its own: compact_rev_key in that group's
        keyspace, a read below its revision refused there as compacted and one at it served."""
        group = self.store.group(self.store.MOVED)
        interval = _parse_duration(self.args.compaction_interval)

        def compacted():
            v = group.get(b"compact_rev_key")
            if v is None or not v.isdigit():
                return f"compact_rev_key={v!r}"
            rev = int(v)
            below, at = self.compacted(rev - 1, group), self.compacted(rev, group)
            return (below and not at and rev) or f"compact_rev_key={rev}: below {below}, at {at}"

        try:
            rev = self.wait_until("the apiserver's compaction of the leases-events group", compacted,
                                  2 * interval + 30, interval=2)
            self.check("kube-apiserver compacts the leases-events group at its own compact_rev_key", True,
                       f"compact_rev_key={rev} in {self.store.MOVED}: a read at {rev - 1} refused as compacted, "
                       f"at {rev} served")
        except CheckFailed as e:
            self.check("kube-apiserver compacts the leases-events group at its own compact_rev_key", False, str(e))

    def scale_roll_delete(self) -> None:
        s, r = self.p.scale_to, self.p.replicas
        t0 = time.monotonic()
        self.kubectl("scale", "deployment/web", "-n", "e2e-apps", f"--replicas={s}")

        def scaled():
            pods = self.pods("e2e-apps")
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            return (len(pods) == s and len(running) == s and pods) or f"{len(pods)} pods, {len(running)} Running"

        pods = self.wait_until(f"scale down to {s}", scaled, self.p.rollout_timeout)
        took = time.monotonic() - t0
        rs_replicas = [x["spec"]["replicas"] for x in self.kjson("get", "replicasets", "-n", "e2e-apps")["items"]]
        stored = self.stored("pods", "e2e-apps")
        on_kwok = all(p["spec"].get("nodeName") in self.kwok_nodes() for p in pods)
        self.check(f"scaled {r} -> {s}", rs_replicas == [s] and stored == s and on_kwok,
                   f"{took:.1f}s; ReplicaSet spec.replicas {rs_replicas}, {stored} pods stored, "
                   f"{'all' if on_kwok else 'not all'} on kwok nodes")
        t0 = time.monotonic()
        self.kubectl("set", "env", "deployment/web", "-n", "e2e-apps", "ROLL=2")
        self.kubectl("rollout", "status", "deployment/web", "-n", "e2e-apps",
                     f"--timeout={int(self.p.rollout_timeout)}s", timeout=self.p.rollout_timeout + 30)

        def rolled():
            rs = self.kjson("get", "replicasets", "-n", "e2e-apps")["items"]
            pods = self.pods("e2e-apps")
            new = [x for x in rs if x["status"].get("readyReplicas", 0) == s and x["spec"]["replicas"] == s]
            old = [x for x in rs if x["spec"]["replicas"] == 0]
            return (len(rs) == 2 and len(new) == 1 and len(old) == 1 and len(pods) == s and (new[0], old[0], pods)) \
                or f"{len(rs)} ReplicaSets, {len(pods)} pods"

        new, old, pods = self.wait_until("rolling update settled", rolled, self.p.rollout_timeout)
        took = time.monotonic() - t0

        def roll(rs) -> list:
            return [e.get("value") for c in rs["spec"]["template"]["spec"]["containers"]
                    for e in c.get("env", []) if e.get("name") == "ROLL"]

        owners = sorted({ref["name"] for p in pods for ref in p["metadata"].get("ownerReferences", [])})
        stored = self.stored("replicasets", "e2e-apps")
        self.check("rolling update", roll(new) == ["2"] and roll(old) == [] and owners == [new["metadata"]["name"]]
                   and stored == 2,
                   f"{took:.1f}s, new ReplicaSet {s}/{s} ready with ROLL={roll(new)}, old at 0 with ROLL={roll(old)}, "
                   f"the pods owned by {owners}, {stored} ReplicaSets stored")
        t0 = time.monotonic()
        self.kubectl("delete", "deployment", "web", "-n", "e2e-apps", "--timeout=120s", timeout=150)

        def gone():
            pods = self.pods("e2e-apps")
            rs = self.kjson("get", "replicasets", "-n", "e2e-apps")["items"]
            return (not pods and not rs) or f"{len(pods)} pods, {len(rs)} ReplicaSets left"

        self.wait_until("Deployment, ReplicaSets and pods deleted", gone, 180)
        took = time.monotonic() - t0
        left = {kind: self.stored(kind, "e2e-apps") for kind in ("deployments", "replicasets", "pods")}
        self.check("Deployment deleted with its ReplicaSets and pods", not any(left.values()),
                   f"{took:.1f}s; left in {self.store.label}: {left}")
        total_pods = r + s  # the first ReplicaSet, then the rolled one
        self.facts["pods_created"] = total_pods
        w = self.pod_watch
        end = time.monotonic() + 30
        while time.monotonic() < end and (len(w.names("DELETED")) < total_pods or w.names("ADDED") - w.names("DELETED")):
            time.sleep(0.5)
        added, deleted = w.names("ADDED"), w.names("DELETED")
        self.facts["pod_watch_resumes"] = w.closes
        self.check("the pod watch saw every pod come and go",
                   len(added) >= total_pods and added == deleted and not w.errors,
                   f"{len(added)} pods ADDED, {len(deleted)} DELETED, events {w.counts()}, "
                   f"closed by the apiserver and resumed from its last resourceVersion {w.closes} times"
                   + (f"; errors {w.errors[:3]}" if w.errors else ""))

    def events_and_compaction(self) -> None:
        """Leases and compaction: Events carry a lease of --event-ttl (plus the
        apiserver's reuse window, up to 5%); the apiserver compacts brain every
        --etcd-compaction-interval (its first tick records a revision, the
        second compacts to it)."""
        ttl = _parse_duration(self.args.event_ttl)
        interval = _parse_duration(self.args.compaction_interval)
        slack = 30.0
        # Like etcd, brain may give leases their full TTL again when it restarts.
        since = max(self.restart_done_wall or 0.0, self.cp_started_wall)
        wait = since + ttl * 1.05 + slack - time.time()
        if wait > 0:
            self.log(f"waiting {wait:.0f}s so that events written before the restart are past their TTL")
            time.sleep(self.time_left(wait))
        now = time.time()
        events = self.kjson("get", "events", "-A", timeout=120)["items"]

        def last_write(e) -> float:
            stamps = [e.get("lastTimestamp"), e.get("eventTime"), (e.get("series") or {}).get("lastObservedTime"),
                      e["metadata"].get("creationTimestamp")]
            return max(_ts(x) for x in stamps if x)

        overdue = [e["metadata"]["name"] for e in events
                   if now > max(last_write(e), since) + ttl * 1.05 + slack]
        posted = promstats.total(self.metrics(), "apiserver_request_total",
                                 lambda lb: lb.get("resource") == "events" and lb.get("verb") == "POST"
                                 and lb.get("code") == "201")
        self.facts["events_created"] = int(posted)
        self.facts["events_present"] = len(events)
        self.check("events expire with their leases (--event-ttl)", not overdue and posted > len(events),
                   f"{posted:.0f} events created, {len(events)} present, {len(overdue)} past ttl {ttl:.0f}s + "
                   f"{slack:.0f}s" + (f": {overdue[:3]}" if overdue else ""))

        def compacted():
            v = self.store.get(b"compact_rev_key")
            return (v is not None and v.isdigit() and int(v) > 0 and v) or f"compact_rev_key={v!r}"

        left = self.cp_started_wall + 2 * interval + slack - time.time()
        value = self.wait_until("the apiserver's compaction", compacted, max(left, 0) + interval + slack)
        self.facts["compact_rev"] = int(value)
        # The apiserver writes the revision it compacts to under compact_rev_key,
        # then compacts: the storage must refuse reads below it and serve it.
        # Read again while it does not, for one more compaction interval: the
        # read may have fallen between the write and the Compact call, and a
        # Compact sent while a replica was cut off fails there as on etcd
        # ("request timed out"); the apiserver's next tick writes and compacts
        # again.
        try:
            until = time.time() + interval + slack
            while True:
                rev = int(self.store.get(b"compact_rev_key"))
                below, at = self.compacted(rev - 1), self.compacted(rev)
                if (below and not at) or time.time() > until:
                    break
                time.sleep(2)
            self.check(f"the apiserver compacted {self.store.label} at compact_rev_key's revision",
                       below and not at, f"compact_rev_key={rev}: a read at {rev - 1} "
                       f"{'refused as compacted' if below else 'served'}, at {rev} {'refused' if at else 'served'}")
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            self.check(f"the apiserver compacted {self.store.label} at compact_rev_key's revision", False, repr(e))
        try:
            from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc
            with self.store.channel() as ch:
                rpc_pb2_grpc.KVStub(ch).Range(rpc_pb2.RangeRequest(key=b"/registry/", revision=1), timeout=10)
            self.check("a read at revision 1 is refused as compacted", False, "it succeeded")
        except Exception as e:  # noqa: BLE001 - the expected error
            self.check("a read at revision 1 is refused as compacted", "compacted" in str(e),
                       str(getattr(e, "details", lambda: e)()))

    def compacted(self, revision: int, store=None) -> bool:
        """True when the storage (``store``: one group of it) refuses a read at ``revision`` as compacted."""
        import grpc

        from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc

        try:
            with (store or self.store).channel() as ch:
                rpc_pb2_grpc.KVStub(ch).Range(rpc_pb2.RangeRequest(key=b"compact_rev_key", revision=revision),
                                              timeout=10)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.OUT_OF_RANGE and "compacted" in (e.details() or ""):
                return True
            raise
        return False

    def metrics_summary(self) -> None:
        now = self.metrics()
        before = getattr(self, "metrics_before_restart", None)
        consistent = promstats.total(now, "apiserver_watch_cache_consistent_read_total",
                                     lambda lb: lb.get("success") == "true" and lb.get("fallback") == "false")
        fallback = promstats.total(now, "apiserver_watch_cache_consistent_read_total",
                                   lambda lb: lb.get("fallback") != "false")
        self.facts["consistent_reads_from_cache"] = consistent
        self.facts["consistent_reads_fallback"] = fallback
        self.check("consistent lists served from the watch cache (RequestWatchProgress on)", consistent > 0,
                   f"{consistent:.0f} from cache, {fallback:.0f} fell back or skipped")
        # kube-apiserver 1.37 lists with etcd 3.7's KV.RangeStream (the
        # EtcdRangeStream gate, on by default) and falls back to paged Range
        # where it is answered Unimplemented, as etcd 3.6 answers it.
        streamed = promstats.histogram(now, "etcd_request_duration_seconds",
                                       lambda lb: lb.get("operation") == "listStream").count
        self.facts["lists_streamed"] = int(streamed)
        if isinstance(self.store, Etcd):
            self.check("lists fall back to paged Range (etcd 3.6 has no RangeStream)", streamed == 0,
                       f"{streamed:.0f} streamed lists")
        else:
            self.check("lists stream with KV.RangeStream", streamed > 0, f"{streamed:.0f} streamed lists")
        groups = {
            "mutating": lambda lb: lb.get("verb") in ("POST", "PUT", "PATCH", "DELETE"),
            "get": lambda lb: lb.get("verb") == "GET",
            "list": lambda lb: lb.get("verb") == "LIST",
        }
        table = {}
        for label, keep in groups.items():
            whole = promstats.histogram(now, "apiserver_request_duration_seconds", keep)
            row = {"count": int(whole.count), "p50": whole.quantile(0.5), "p90": whole.quantile(0.9),
                   "p99": whole.quantile(0.99), "slo_p99": SLO[label]}
            if before is not None:
                steady = promstats.histogram(before, "apiserver_request_duration_seconds", keep)
                row["p99_before_restart"] = steady.quantile(0.99)
                after = whole.minus(steady)
                row["p99_after_restart"] = after.quantile(0.99)
            table[label] = row
        self.facts["apiserver_request_latency"] = table
        for label, row in table.items():
            p99 = row["p99_before_restart"] if "p99_before_restart" in row else row["p99"]
            self.check(f"{label} calls p99 within SLO ({SLO[label]:g}s, before the restart)",
                       p99 is not None and p99 <= SLO[label],
                       f"p50 {_fmt(row['p50'])} p90 {_fmt(row['p90'])} p99 {_fmt(row['p99'])} over {row['count']} "
                       f"calls (whole run); p99 before restart {_fmt(row.get('p99_before_restart'))}")
        etcd_ops = {}
        for op in ("get", "create", "update", "delete", "list", "listStream", "listWithCount", "getList"):
            h = promstats.histogram(now, "etcd_request_duration_seconds", lambda lb, op=op: lb.get("operation") == op)
            if h.count:
                etcd_ops[op] = {"count": int(h.count), "p50": h.quantile(0.5), "p99": h.quantile(0.99)}
        self.facts["apiserver_etcd_request_latency"] = etcd_ops

    def scan_apiserver_log(self) -> None:
        text = self.cp.apiserver.log_path.read_text(errors="replace")
        klog = re.compile(r"^([EWIF])(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)")
        etcd_words = re.compile(r"etcd|grpc|rpc error|storage|watch chan|compact", re.I)
        year = _dt.datetime.now().year
        bad, during, warnings = [], [], []
        for line in text.splitlines():
            if "RequestWatchProgress" in line or "Failed to parse etcd version" in line:
                bad.append(line)
                continue
            m = klog.match(line)
            if not m or m.group(1) not in "EFW" or not etcd_words.search(line):
                continue
            if m.group(1) == "W" and "Skipping API" in line:
                continue
            t = _dt.datetime(year, int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                             int(m.group(6))).timestamp()
            if any(w0 - 1 <= t <= w1 for w0, w1 in self.restart_windows):
                during.append(line)
            elif m.group(1) == "W":
                warnings.append(line)
            else:
                bad.append(line)
        self.facts["apiserver_etcd_errors_outside_restart"] = len(bad)
        self.facts["apiserver_etcd_errors_during_restart"] = len(during)
        self.facts["apiserver_etcd_warnings_outside_restart"] = len(warnings)
        (self.workdir / "apiserver-etcd-errors.txt").write_text("\n".join(
            bad + ["--- warnings outside the restart ---"] + warnings + ["--- during the restart ---"] + during))
        if warnings:
            self.log(f"{len(warnings)} etcd-related warnings outside the restart, e.g. {warnings[0][:300]}")
        self.check("apiserver log: no etcd errors outside the restart, RequestWatchProgress not refused",
                   not bad, "; ".join(x[:240] for x in bad[:5]) or f"{len(during)} error/warning lines during the restart")

    def run(self) -> None:
        try:
            self.bring_up()
            self.make_nodes()
            self.namespaces()
            self.start_watches()
            self.configmaps()
            self.crd()
            self.deployment()
            if self.backend == "brain-cluster":
                self.kill_cluster_leader()
                self.cut_cluster_follower()
            elif self.backend == "brain-groups":
                self.groups_keyspaces()
                self.groups_resource_versions()
                self.kill_moved_group()
            else:
                self.restart_storage("sigterm")
                self.restart_storage("kill9")
            self.scale_roll_delete()
            self.events_and_compaction()
            if self.backend == "brain-groups":
                self.groups_compaction()
            code, body = self.cp.http_get("/readyz?verbose")
            self.check("/readyz green at the end", code == 200 and "[+]etcd ok" in body, f"HTTP {code}")
        except (CheckFailed, StartError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            detail = str(e)
            if isinstance(e, subprocess.CalledProcessError):
                detail = f"{' '.join(e.cmd[3:])[:200]} -> {e.returncode}: {(e.stderr or '').strip()[-800:]}"
            self.check("scenario ran to the end", False, detail)
        finally:
            for step in (self.metrics_summary, self.scan_apiserver_log):
                try:
                    if self.cp.apiserver.alive:
                        step()
                except Exception as e:  # noqa: BLE001 - reported as a failed check
                    self.check(step.__name__, False, repr(e))
            self.facts["storage_rss_mib"] = self.store.rss_mib()
            for w in self.watches:
                w.stop()
            for wr in self.writers:
                wr.stop()
            self.cp.stop()
            code = self.store.stop(30)
            self.check(f"{self.store.label} exits cleanly at the end",
                       code == 0 or (not self.backend.startswith("brain") and code == -15), f"exit code {code}")
            self.facts["elapsed_s"] = round(time.monotonic() - self.t0, 1)

    @property
    def ok(self) -> bool:
        return all(ok for _n, ok, _d in self.checks)


def _parse_duration(s: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", s)
    if not m:
        raise ValueError(f"bad duration {s!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def _fmt(v) -> str:
    return "n/a" if v is None else (f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s")


def print_summary(runs: list[Run]) -> None:
    print("\n======== brain e2e summary ========")
    for r in runs:
        f = r.facts
        label = r.store.label
        passed = sum(1 for _n, ok, _d in r.checks if ok)
        print(f"\n[{r.name}] {'OK' if r.ok else 'FAILED'}: {passed}/{len(r.checks)} checks, "
              f"{f.get('elapsed_s')}s, work dir {r.workdir}")
        print(f"  kubernetes {f.get('kubernetes_version')}, {label} reports etcd {f.get('storage_version')}, "
              f"{label} RSS {f.get('storage_rss_mib') and round(f['storage_rss_mib'])} MiB")
        print(f"  created: {f.get('namespaces', 0)} namespaces, {f.get('configmaps_created', 0)} ConfigMaps "
              f"({f.get('configmaps_per_s')}/s), {f.get('widgets_created', 0)} Widgets (CRD), "
              f"{r.p.nodes} nodes, {f.get('pods_created', 0)} pods")
        print(f"  all {r.p.replicas} pods Running after {f.get('pods_running_s')}s; pod startup p50 "
              f"{f.get('pod_startup_p50_s')}s p99 {f.get('pod_startup_p99_s')}s (SLO p99 <= 5s)")
        if r.backend == "brain-groups":
            print(f"  {label}: keys {f.get('groups_keys')}, head revisions {f.get('groups_head_revisions')}; "
                  f"kill -9 of the leases-events group: serving again {f.get('groups_restart_s')}s later")
        elif r.backend == "brain-cluster":
            print(f"  {label} leader kill -9: new leader after {f.get('cluster_new_leader_s')}s, first write "
                  f"acknowledged {f.get('cluster_write_pause_s')}s after the kill, apiserver /readyz green "
                  f"{f.get('cluster_apiserver_healthy_s')}s after it, the killed replica rejoined in "
                  f"{f.get('cluster_rejoin_s')}s; {f.get('kill9_configmaps_acknowledged')} ConfigMaps "
                  f"acknowledged across it")
        else:
            print(f"  {label} restart: SIGTERM to exit {f.get('storage_stop_s')}s, start to serving "
                  f"{f.get('storage_sigterm_start_s')}s, to apiserver /readyz green "
                  f"{f.get('storage_sigterm_recovery_s')}s; kill -9: start to serving "
                  f"{f.get('storage_kill9_start_s')}s, to /readyz green {f.get('storage_kill9_recovery_s')}s, "
                  f"{f.get('kill9_configmaps_acknowledged')} ConfigMaps acknowledged across it")
        print(f"  consistent reads from cache {f.get('consistent_reads_from_cache')}, "
              f"fallbacks {f.get('consistent_reads_fallback')}")
        lat = f.get("apiserver_request_latency") or {}
        for group, row in lat.items():
            print(f"  apiserver {group:8s} n={row['count']:6d}  p50 {_fmt(row['p50']):>7s}  p90 {_fmt(row['p90']):>7s}"
                  f"  p99 {_fmt(row['p99']):>7s}  (before restart {_fmt(row.get('p99_before_restart'))}) "
                  f"SLO p99 <= {row['slo_p99']:g}s")
        for op, row in (f.get("apiserver_etcd_request_latency") or {}).items():
            print(f"  storage {op:13s} n={row['count']:6d}  p50 {_fmt(row['p50']):>7s}  p99 {_fmt(row['p99']):>7s}")
        failed = [(n, d) for n, ok, d in r.checks if not ok]
        for n, d in failed:
            print(f"  FAILED {n}: {d[:600]}")
    for r in runs:
        base = next((b for b in runs if b is not r and b.backend != "brain" and b.transport == r.transport
                     and b.p.name == r.p.name), None)
        if r.backend == "brain" and base is not None:
            print(baseline_table(r, base))
    total = sum(len(r.checks) for r in runs)
    failed = sum(1 for r in runs for _n, ok, _d in r.checks if not ok)
    print(f"\ne2e: {total - failed} passed, {failed} failed")


def baseline_table(brain: Run, base: Run) -> str:
    """brain's latencies next to the baseline's, same scenario, same invocation."""
    a, b = brain.facts, base.facts
    lines = [f"\n[{brain.name}] next to [{base.name}] (same scenario, same machine, one after the other):",
             f"  {'':36s} {'brain':>9s} {base.store.label:>9s}"]

    def row(name, x, y, fmt=_fmt):
        lines.append(f"  {name:36s} {fmt(x):>9s} {fmt(y):>9s}")

    for group in ("mutating", "get", "list"):
        ra = (a.get("apiserver_request_latency") or {}).get(group) or {}
        rb = (b.get("apiserver_request_latency") or {}).get(group) or {}
        for q in ("p50", "p99"):
            row(f"apiserver {group} {q}", ra.get(q), rb.get(q))
        row(f"apiserver {group} p99 pre-restart", ra.get("p99_before_restart"), rb.get("p99_before_restart"))
    secs = lambda v: "n/a" if v is None else f"{v:.1f}s"  # noqa: E731
    row("pod startup p99", a.get("pod_startup_p99_s"), b.get("pod_startup_p99_s"), secs)
    row("200 pods Running", a.get("pods_running_s"), b.get("pods_running_s"), secs)
    row("ConfigMaps created /s", a.get("configmaps_per_s"), b.get("configmaps_per_s"),
        lambda v: "n/a" if v is None else f"{v:.0f}")
    row("SIGTERM: start to /readyz", a.get("storage_sigterm_recovery_s"), b.get("storage_sigterm_recovery_s"), secs)
    row("kill -9: start to /readyz", a.get("storage_kill9_recovery_s"), b.get("storage_kill9_recovery_s"), secs)
    row("RSS MiB", a.get("storage_rss_mib"), b.get("storage_rss_mib"), lambda v: "n/a" if v is None else f"{v:.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", default="all", choices=["all", "tcp", "tls", "unix", "cluster", "groups"],
                    help="all = full profile over tcp (+ the baseline), then smoke over tls and unix; "
                         "cluster = a 3-replica brain cluster on NATS over tcp, its leader killed mid-run; "
                         "groups = `brain groups` over tcp, Leases and Events in a group of their own "
                         "(smoke profile by default)")
    ap.add_argument("--profile", choices=sorted(PROFILES), help="default: full for tcp, smoke otherwise")
    ap.add_argument("--baseline", choices=["etcd-3.6", "none"],
                    help="after a tcp run, the same scenario on this server (default: etcd-3.6 for the full tcp "
                         "profile, none otherwise)")
    ap.add_argument("--configmaps", type=int, help="override the profile's ConfigMap count")
    ap.add_argument("--replicas", type=int, help="override the profile's Deployment size")
    ap.add_argument("--nodes", type=int, help="override the profile's kwok node count")
    ap.add_argument("--event-ttl", default="30s", help="kube-apiserver --event-ttl (short: the run waits it out)")
    ap.add_argument("--compaction-interval", default="30s", help="kube-apiserver --etcd-compaction-interval")
    ap.add_argument("--timeout", type=float, default=1200.0, help="deadline of one run, seconds")
    ap.add_argument("--workdir", type=Path, help="parent of the run directories (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directories even when all passed")
    ap.add_argument("--rebuild", action="store_true", help="build.sh --force")
    args = ap.parse_args(argv)

    t_build = time.monotonic()
    cache = build(args.rebuild)
    print(f"control plane binaries ready in {time.monotonic() - t_build:.1f}s: {cache / 'bin'}", flush=True)
    args.k8s_version = cache.name.split("-kwok-")[0]
    plan = [("tcp", "full"), ("tls", "smoke"), ("unix", "smoke")] if args.transport == "all" \
        else [(args.transport, args.profile or ("full" if args.transport == "tcp" else "smoke"))]
    etcd_binary = None
    if any(_baseline(args, t, p) for t, p in plan):
        from tests.support.servers import etcd_binary as find_etcd

        found = find_etcd("3.6")
        if found is None:
            raise SystemExit("etcd 3.6 for the baseline run is unavailable (benchmarks/build.sh etcd-3.6 failed)")
        etcd_binary = Path(found)
    parent = Path(tempfile.mkdtemp(prefix="brain-e2e-", dir=args.workdir))
    runs = []
    for transport, pname in plan:
        prof = PROFILES[pname]
        overrides = {k: getattr(args, k) for k in ("configmaps", "replicas", "nodes") if getattr(args, k)}
        if overrides:
            from dataclasses import replace
            prof = replace(prof, **overrides)
            prof = replace(prof, scale_to=max(1, min(prof.scale_to, prof.replicas // 2)))
        backends = ["brain"] + ([_baseline(args, transport, pname)] if _baseline(args, transport, pname) else [])
        if transport == "cluster":
            transport, backends = "tcp", ["brain-cluster"]
        elif transport == "groups":
            transport, backends = "tcp", ["brain-groups"]
        for backend in backends:
            wd = parent / (f"{transport}-{pname}" + ("" if backend == "brain" else f"-{backend}"))
            wd.mkdir()
            run = Run(args, cache, transport, prof, wd, backend=backend, etcd_binary=etcd_binary)
            runs.append(run)
            run.run()
            (wd / "summary.json").write_text(json.dumps({"checks": run.checks, "facts": run.facts}, indent=1,
                                                        default=str))
    print_summary(runs)
    ok = all(r.ok for r in runs)
    if ok and not args.keep:
        for r in runs:
            shutil.rmtree(r.store.data_dir, ignore_errors=True)
        print(f"logs kept in {parent} (storage data removed)")
    else:
        print(f"work directories kept in {parent}")
    return 0 if ok else 1


def _baseline(args, transport: str, profile: str) -> str | None:
    """The server the same scenario runs on after brain's (or None)."""
    if args.baseline == "none" or transport != "tcp":
        return None
    if args.baseline:
        return args.baseline
    return "etcd-3.6" if profile == "full" else None


if __name__ == "__main__":
    sys.exit(main())
