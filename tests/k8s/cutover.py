"""A Kubernetes cluster moved from etcd 3.6 to brain and back, revisions kept.

    python -m tests.k8s.cutover [--keep]

The procedure of docs/migration.md, on loopback with mutual TLS everywhere:
  1. etcd 3.6 (built by benchmarks/build.sh) and a control plane on it
     (kube-apiserver, kube-controller-manager, kube-scheduler, kwok nodes);
     namespaces, ConfigMaps, Secrets, a CRD and objects of it, a Deployment
     Running on the kwok nodes, Events (each with an etcd lease).
  2. An informer-style watch of ConfigMaps (HTTP watch with bookmarks,
     resumed from the last resourceVersion it saw whenever its connection
     ends; it never lists again) is opened and kept for the whole run.
  3. `brain mirror --from https://etcd ... --cacert --cert --key` copies etcd
     and follows it while the cluster keeps working.
  4. Cutover: the controllers stop, a last write is made (the informer sees
     it), kube-apiserver stops; the mirror reaches etcd's last revision and
     is stopped (it drains); brain serves the directory over TLS and
     kube-apiserver starts again with --etcd-servers pointing at brain.
     Checks: brain's revision is etcd's; every object has the resourceVersion
     it had on etcd; the informer's watch resumes from its resourceVersion
     without a 410 and sees the next changes; the controllers carry on.
  5. The way back: kube-apiserver stops, `etcdctl snapshot save` against
     brain, `etcdutl snapshot restore`, etcd 3.6 serves it and kube-apiserver
     points at etcd again: the same checks.
Exit code 0 when every check passed; the work directory is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.k8s.cluster import SERVICE_IP, Brain, ControlPlane, Proc, StartError, free_port, log_tail  # noqa: E402
from tests.k8s.e2e import build  # noqa: E402
from tests.k8s.pki import make_cluster_pki  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
NS = "cutover"


class CheckFailed(RuntimeError):
    pass


def etcd_tools() -> Path:
    """etcd-3.6, etcdctl-3.6 and etcdutl-3.6 from benchmarks/build.sh (used
    as they are when already in its cache, as tests/support/etcd_tools does)."""
    cached = Path(os.environ.get("BRAIN_BENCH_CACHE", REPO_ROOT / ".cache" / "bench")) / "bin"
    if all((cached / n).is_file() for n in ("etcd-3.6", "etcdctl-3.6", "etcdutl-3.6")):
        return cached
    r = subprocess.run(["bash", str(REPO_ROOT / "benchmarks" / "build.sh"), "etcd-3.6", "etcdutl-3.6"],
                       stdout=subprocess.PIPE, text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"benchmarks/build.sh failed with exit code {r.returncode}")
    return Path(r.stdout.strip().splitlines()[-1])


class Etcd:
    """etcd 3.6 on loopback with client TLS (the PKI's etcd server certificate,
    client certificates required), as kube-apiserver's store."""

    def __init__(self, bindir: Path, workdir: Path, pki, name: str) -> None:
        self.bindir = bindir
        self.pki = pki
        self.port, self.peer_port = free_port(), free_port()
        self.data_dir = workdir / f"{name}-data"
        self.name = name
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.peer = peer
        self.proc = Proc(name, [
            str(bindir / "etcd-3.6"), "--name", "e", "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", f"e={peer}",
            "--cert-file", str(pki.etcd_server.cert), "--key-file", str(pki.etcd_server.key),
            "--trusted-ca-file", str(pki.etcd_ca.cert), "--client-cert-auth",
        ], workdir / f"{name}.log")

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def tls_flags(self) -> list[str]:
        p = self.pki
        return [f"--cacert={p.etcd_ca.cert}", f"--cert={p.etcd_client.cert}", f"--key={p.etcd_client.key}"]

    def apiserver_flags(self) -> list[str]:
        p = self.pki
        return [f"--etcd-servers={self.url}", f"--etcd-cafile={p.etcd_ca.cert}",
                f"--etcd-certfile={p.etcd_client.cert}", f"--etcd-keyfile={p.etcd_client.key}"]

    def revision(self, url: str | None = None) -> int:
        from brain.api.etcd_client import ClientTLS, EtcdClient

        p = self.pki
        c = EtcdClient(url or self.url, ClientTLS(str(p.etcd_ca.cert), str(p.etcd_client.cert), str(p.etcd_client.key)))
        try:
            return c.revision()
        finally:
            c.close()

    def start(self, timeout: float = 60.0) -> None:
        self.proc.start()
        deadline = time.monotonic() + timeout
        while True:
            self.proc.check_alive()
            try:
                self.revision()
                return
            except Exception:  # noqa: BLE001 - retried until the deadline
                if time.monotonic() > deadline:
                    raise StartError(f"{self.name} not serving after {timeout:.0f}s:\n{log_tail(self.proc.log_path)}")
                time.sleep(0.3)


class Informer:
    """An informer's watch of ConfigMaps in one namespace: an HTTP watch with
    bookmarks from a resourceVersion, opened again from the last
    resourceVersion it saw (an event's or a bookmark's) whenever the
    connection ends, as client-go's reflector does; it records any ERROR
    (a 410 would force an informer to list again) and never lists itself."""

    def __init__(self, server: str, token: str, ca: Path, rv: str, log) -> None:
        self.server, self.token, self.rv = server, token, rv
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.log = log
        self.events: list[tuple[str, str, str]] = []
        self.errors: list[str] = []
        self.connects = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._resp = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            url = (f"{self.server}/api/v1/namespaces/{NS}/configmaps?watch=1&allowWatchBookmarks=true"
                   f"&resourceVersion={self.rv}&timeoutSeconds=1800")
            req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
            try:
                with urllib.request.urlopen(req, context=self.ctx, timeout=3600) as resp:
                    self._resp = resp
                    with self._cond:
                        self.connects += 1
                        self._cond.notify_all()
                    for line in resp:
                        ev = json.loads(line)
                        typ, obj = ev.get("type"), ev.get("object") or {}
                        meta = obj.get("metadata") or {}
                        with self._cond:
                            if typ == "ERROR":
                                self.errors.append(f"{obj.get('code')} {obj.get('reason')}: {obj.get('message')}")
                                self._stop.set()
                            else:
                                self.rv = meta.get("resourceVersion") or self.rv
                                self.events.append((typ, meta.get("name", ""), self.rv))
                            self._cond.notify_all()
            except (urllib.error.URLError, OSError, ValueError, AttributeError) as e:  # (AttributeError: closed by stop())
                if isinstance(e, urllib.error.HTTPError):
                    with self._cond:
                        self.errors.append(f"HTTP {e.code}: {e.read()[:300]!r}")
                        if e.code == 410:
                            self._stop.set()
            self._resp = None
            self._stop.wait(0.5)

    def wait_for(self, typ: str, name: str, timeout: float) -> str | None:
        """The resourceVersion of the first such event, waiting up to timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for t, n, rv in self.events:
                    if (t, n) == (typ, name):
                        return rv
                if self.errors or time.monotonic() > deadline:
                    return None
                self._cond.wait(0.5)

    def wait_connected(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.connects < count and not self.errors:
                if time.monotonic() > deadline:
                    return False
                self._cond.wait(0.5)
            return self.connects >= count

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            try:
                resp.close()
            except Exception:  # noqa: BLE001
                pass
        self._thread.join(5)


class Cutover:
    def __init__(self, args, cache: Path, etcd_bin: Path, workdir: Path) -> None:
        self.args = args
        self.cache, self.etcd_bin, self.workdir = cache, etcd_bin, workdir
        self.t0 = time.monotonic()
        self.checks: list[tuple[str, bool, str]] = []
        self.pki = make_cluster_pki(workdir / "pki", SERVICE_IP)
        self.api_port = free_port()
        self.etcd = Etcd(etcd_bin, workdir, self.pki, "etcd")
        self.brain = Brain(workdir, "tls", self.pki)
        self.cp: ControlPlane | None = None
        self.informer: Informer | None = None
        self.mirror: subprocess.Popen | None = None
        self.etcd2: Etcd | None = None

    # -- reporting ------------------------------------------------------------
    def log(self, msg: str) -> None:
        print(f"[cutover {time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, bool(ok), detail))
        self.log(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
        return ok

    def require(self, name: str, ok: bool, detail: str = "") -> None:
        if not self.check(name, ok, detail):
            raise CheckFailed(f"{name}: {detail}")

    # -- the control plane ------------------------------------------------------
    def control_plane(self, store) -> ControlPlane:
        cp = ControlPlane(self.cache / "bin", self.workdir, self.pki, store, self.cache / "kwok-stages.yaml",
                          event_ttl="10m", compaction_interval="10m", port=self.api_port)
        # Nothing but the test writes while it cuts over: no apiserver identity
        # lease renewals (the apiserver's own periodic write).
        cp.apiserver.argv.append("--feature-gates=APIServerIdentity=false,UnknownVersionInteroperabilityProxy=false")
        return cp

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        argv = [str(self.cache / "bin" / "kubectl"), f"--kubeconfig={self.cp.kubeconfig}", *args]
        r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise CheckFailed(f"kubectl {' '.join(args)[:200]}: {r.stderr.strip()[-500:]}")
        return r.stdout

    def objects(self) -> dict[tuple[str, str, str], str]:
        """(kind, namespace, name) -> resourceVersion of every object the test made."""
        out = {}
        for kind in ("namespaces", "configmaps", "secrets", "deployments", "replicasets", "pods",
                     f"widgets.{'cutover.brain.test'}", "customresourcedefinitions", "nodes"):
            items = json.loads(self.kubectl("get", kind, "-A", "-o", "json", timeout=300))["items"]
            for it in items:
                m = it["metadata"]
                out[(kind, m.get("namespace", ""), m["name"])] = m["resourceVersion"]
        return out

    def wait(self, what: str, fn, timeout: float, interval: float = 1.0):
        end = time.monotonic() + timeout
        last = None
        while True:
            try:
                last = fn()
            except CheckFailed as e:
                last = str(e)
            else:
                if last and not isinstance(last, str):
                    return last
            if time.monotonic() > end:
                raise CheckFailed(f"timed out after {timeout:.0f}s waiting for {what} (last: {str(last)[:300]})")
            time.sleep(interval)

    def start_control_plane(self, store, controllers: bool) -> None:
        self.cp = self.control_plane(store)
        self.cp.apiserver.start()
        took, _ = self.cp.wait_readyz(180)
        if controllers:
            for p in (self.cp.controller_manager, self.cp.scheduler, self.cp.kwok):
                p.start()
        self.log(f"kube-apiserver on {type(store).__name__.lower()} ready in {took:.1f}s")

    def stop_controllers(self) -> None:
        for p in (self.cp.kwok, self.cp.scheduler, self.cp.controller_manager):
            p.stop(20)

    # -- the scenario -----------------------------------------------------------
    def populate(self) -> None:
        self.kubectl("create", "namespace", NS)
        items = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i:03d}", "namespace": NS},
                  "data": {"i": str(i)}} for i in range(self.args.objects)]
        items += [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"s-{i:03d}", "namespace": NS},
                   "stringData": {"i": str(i)}} for i in range(self.args.objects // 4)]
        self.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": "widgets.cutover.brain.test"},
               "spec": {"group": "cutover.brain.test", "scope": "Namespaced",
                        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                            "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
        self.kubectl("create", "-f", "-", stdin=json.dumps(crd))
        self.kubectl("wait", "--for=condition=Established", "crd/widgets.cutover.brain.test", "--timeout=60s")
        widgets = [{"apiVersion": "cutover.brain.test/v1", "kind": "Widget",
                    "metadata": {"name": f"w-{i:02d}", "namespace": NS}, "spec": {"i": i}} for i in range(20)]
        # (discovery can lag the Established condition: apply again until all are there)
        self.wait("Widgets created", lambda: bool(self.kubectl(
            "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": widgets}))), 60)
        nodes = [{"apiVersion": "v1", "kind": "Node",
                  "metadata": {"name": f"kwok-node-{i}", "annotations": {"kwok.x-k8s.io/node": "fake"},
                               "labels": {"type": "kwok"}},
                  "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                             "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}}} for i in range(3)]
        self.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
        dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": NS},
               "spec": {"replicas": 6, "selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"containers": [{"name": "web", "image": "fake.invalid/web:1"}],
                                              "terminationGracePeriodSeconds": 0}}}}
        self.kubectl("create", "-f", "-", stdin=json.dumps(dep))
        self.wait_running(6)

    def wait_running(self, n: int) -> None:
        def running():
            pods = json.loads(self.kubectl("get", "pods", "-n", NS, "-o", "json"))["items"]
            ok = [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
            return (len(ok) == n and len(pods) == n) or f"{len(ok)}/{n} Running of {len(pods)}"

        self.wait(f"{n} pods Running", running, 180)

    def churn(self, rounds: int, tag: str) -> None:
        for i in range(rounds):
            self.kubectl("patch", "configmap", f"cm-{i % self.args.objects:03d}", "-n", NS, "--type=merge",
                         "-p", json.dumps({"data": {"churn": f"{tag}-{i}"}}))
            self.kubectl("create", "configmap", f"{tag}-{i}", "-n", NS, "--from-literal=k=v")
            if i % 3 == 0:
                self.kubectl("delete", "configmap", f"{tag}-{i}", "-n", NS)

    def quiesce_and_mark(self, store_revision, tag: str) -> int:
        """Controllers stopped: make the last write (the informer sees it) and
        check nothing else wrote after it.  Returns that revision."""
        for attempt in range(5):
            self.kubectl("create", "configmap", f"{tag}-last-{attempt}", "-n", NS, "--from-literal=k=v")
            rv = self.informer.wait_for("ADDED", f"{tag}-last-{attempt}", 30)
            self.require(f"{tag}: the informer sees the last write", rv is not None, f"errors {self.informer.errors}")
            time.sleep(1.0)
            if store_revision() == int(rv):
                return int(rv)
            self.log(f"something wrote after the mark (store at {store_revision()}, mark {rv}); again")
        raise CheckFailed(f"{tag}: the store kept moving after the last write")

    def start_mirror(self) -> None:
        args = [sys.executable, "-m", "brain", "mirror", "--from", self.etcd.url, *self.etcd.tls_flags(),
                "--data-dir", str(self.brain.data_dir), "--progress-interval", "2s", "--lease-poll-interval", "500ms"]
        self.mirror_log = open(self.workdir / "mirror.log", "ab")
        self.mirror = subprocess.Popen(args, stdout=self.mirror_log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT),
                                       env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)

    def mirror_lines(self) -> list[str]:
        return (self.workdir / "mirror.log").read_text(errors="replace").splitlines()

    def leases(self, url: str) -> list[int]:
        from brain.api.etcd_client import ClientTLS, EtcdClient

        p = self.pki
        c = EtcdClient(url, ClientTLS(str(p.etcd_ca.cert), str(p.etcd_client.cert), str(p.etcd_client.key)))
        try:
            return sorted(c.leases())
        finally:
            c.close()

    def cutover_to_brain(self) -> None:
        self.stop_controllers()
        before = self.objects()
        mark = self.quiesce_and_mark(self.etcd.revision, "to-brain")
        down = time.monotonic()
        self.cp.apiserver.stop(10)  # (it can take the whole grace while watch connections are open)
        stopped = time.monotonic()
        etcd_rev = self.etcd.revision()
        self.check("nothing wrote to etcd as kube-apiserver stopped", etcd_rev == mark, f"{etcd_rev} vs {mark}")

        def mirror_caught_up():
            lines = [x for x in self.mirror_lines() if f"revision {etcd_rev:,} of etcd's {etcd_rev:,} (0 behind" in x]
            return bool(lines) or (self.mirror.poll() is not None and "mirror exited") or False

        self.wait("the mirror at etcd's last revision", mirror_caught_up, 60, interval=0.5)
        etcd_leases = self.leases(self.etcd.url)
        t0 = time.monotonic()
        self.mirror.send_signal(signal.SIGTERM)
        code = self.mirror.wait(120)
        final = [x for x in self.mirror_lines() if "stopped at revision" in x]
        self.require("the mirror drains and stops at etcd's last revision",
                     code == 0 and bool(final) and f"stopped at revision {etcd_rev} " in final[-1],
                     f"exit {code}: {final[-1:] or self.mirror_lines()[-5:]}")
        self.etcd.proc.stop(30)
        self.brain.start()
        self.log(f"brain serving the mirrored data {time.monotonic() - t0:.1f}s after the mirror was told to stop")
        _, brain_rev = self.brain.count_prefix(b"/registry/")
        self.require("brain's revision is etcd's last revision", brain_rev == etcd_rev, f"{brain_rev} vs {etcd_rev}")
        brain_leases = self.leases(self.brain.url)
        self.check("brain holds etcd's leases (the Events' TTLs)", brain_leases == etcd_leases and etcd_leases,
                   f"{len(etcd_leases)} on etcd, {len(brain_leases)} on brain")
        self.start_control_plane(self.brain, controllers=False)
        self.log(f"downtime: kube-apiserver down for {time.monotonic() - down:.1f}s, {stopped - down:.1f}s of "
                 f"which it took to stop; mirror drain, brain start and kube-apiserver start on brain: "
                 f"{time.monotonic() - stopped:.1f}s")
        self.verify_after("etcd -> brain", before, mark)
        for p in (self.cp.controller_manager, self.cp.scheduler, self.cp.kwok):
            p.start()

    def verify_after(self, label: str, before: dict, mark: int) -> None:
        after = self.objects()
        changed = {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v}
        self.check(f"{label}: every object keeps its resourceVersion", not changed,
                   f"{len(before)} objects; changed: {list(changed.items())[:5]}")
        ok = self.informer.wait_connected(self.informer_connects + 1, 120)
        self.check(f"{label}: the informer's watch resumes from resourceVersion {self.informer.rv} without a 410",
                   ok and not self.informer.errors, f"errors {self.informer.errors}")
        self.informer_connects = self.informer.connects
        self.kubectl("patch", "configmap", "cm-000", "-n", NS, "--type=merge", "-p",
                     json.dumps({"data": {"after": label}}))
        rv = None
        for _ in range(60):
            rvs = [r for t, n, r in self.informer.events if (t, n) == ("MODIFIED", "cm-000") and int(r) > mark]
            if rvs:
                rv = rvs[-1]
                break
            time.sleep(0.5)
        self.check(f"{label}: the resumed watch delivers the next change after revision {mark}", rv is not None,
                   f"resourceVersion {rv}")

    def back_to_etcd(self) -> None:
        self.wait_running(6)
        self.churn(5, "on-brain")
        self.stop_controllers()
        before = self.objects()
        mark = self.quiesce_and_mark(lambda: self.brain.count_prefix(b"/registry/")[1], "to-etcd")
        self.cp.apiserver.stop(10)
        snap = self.workdir / "brain.snap"
        bindir = self.etcd_bin
        p = self.pki
        r = subprocess.run([str(bindir / "etcdctl-3.6"), f"--endpoints={self.brain.url}", f"--cacert={p.etcd_ca.cert}",
                            f"--cert={p.etcd_client.cert}", f"--key={p.etcd_client.key}", "snapshot", "save", str(snap)],
                           capture_output=True, text=True, timeout=300)
        self.require("etcdctl snapshot save from brain", r.returncode == 0, r.stderr[-500:])
        st = subprocess.run([str(bindir / "etcdutl-3.6"), "snapshot", "status", str(snap), "-w", "json"],
                            capture_output=True, text=True, timeout=300)
        self.require("etcdutl snapshot status reads it", st.returncode == 0 and json.loads(st.stdout)["revision"] == mark,
                     (st.stdout + st.stderr)[-300:])
        self.brain.stop(30)
        self.etcd2 = Etcd(bindir, self.workdir, self.pki, "etcd-back")
        r = subprocess.run([str(bindir / "etcdutl-3.6"), "snapshot", "restore", str(snap), "--data-dir",
                            str(self.etcd2.data_dir), "--name", "e", "--initial-cluster", f"e={self.etcd2.peer}",
                            "--initial-advertise-peer-urls", self.etcd2.peer], capture_output=True, text=True,
                           timeout=300)
        self.require("etcdutl snapshot restore of brain's snapshot", r.returncode == 0, r.stderr[-500:])
        self.etcd2.start()
        rev = self.etcd2.revision()
        self.require("etcd's revision is brain's last revision", rev == mark, f"{rev} vs {mark}")
        self.start_control_plane(self.etcd2, controllers=False)
        self.verify_after("brain -> etcd", before, mark)

    def run(self) -> None:
        try:
            self.etcd.start()
            self.start_control_plane(self.etcd, controllers=True)
            self.populate()
            list_rv = json.loads(self.kubectl("get", "configmaps", "-n", NS, "-o", "json"))["metadata"]["resourceVersion"]
            self.informer = Informer(self.cp.server, self.cp.admin_token, self.pki.k8s_ca.cert, list_rv, self.log)
            self.require("informer watch open", self.informer.wait_connected(1, 30), f"{self.informer.errors}")
            self.informer_connects = 1
            self.start_mirror()
            self.churn(10, "during-mirror")
            self.check("mirror following", any("following" in x for x in self.mirror_lines()),
                       " | ".join(self.mirror_lines()[-3:]))
            self.cutover_to_brain()
            self.back_to_etcd()
        except (CheckFailed, StartError, subprocess.TimeoutExpired) as e:
            self.check("scenario ran to the end", False, str(e)[:2000])
        finally:
            if self.informer is not None:
                self.informer.stop()
            if self.cp is not None:
                self.cp.stop()
            if self.mirror is not None and self.mirror.poll() is None:
                self.mirror.kill()
                self.mirror.wait(10)
            self.brain.stop(30)
            for e in (self.etcd, self.etcd2):
                if e is not None:
                    e.proc.stop(30)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(ok for _n, ok, _d in self.checks)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=200, help="ConfigMaps to create (and a quarter as many Secrets)")
    ap.add_argument("--workdir", type=Path, help="parent of the run directory (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory even when all passed")
    args = ap.parse_args(argv)
    cache = build()
    etcd_bin = etcd_tools()
    workdir = Path(tempfile.mkdtemp(prefix="brain-cutover-", dir=args.workdir))
    run = Cutover(args, cache, etcd_bin, workdir)
    run.log(f"work dir {workdir}")
    run.run()
    passed = sum(1 for _n, ok, _d in run.checks if ok)
    print(f"\ncutover: {passed} passed, {len(run.checks) - passed} failed")
    for n, ok, d in run.checks:
        if not ok:
            print(f"  FAILED {n}: {d[:800]}")
    if run.ok and not args.keep:
        for d in ("brain-data", "etcd-data", "etcd-back-data"):
            shutil.rmtree(workdir / d, ignore_errors=True)
    print(f"logs in {workdir}")
    return 0 if run.ok else 1


if __name__ == "__main__":
    sys.exit(main())
