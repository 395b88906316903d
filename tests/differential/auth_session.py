"""The etcdctl auth session of tests/differential/test_auth_vs_etcd.py and
tests/cluster/test_auth_cluster.py: its steps, how a step is run and how
what differs by nature (times, addresses, IDs) is normalized away."""

from __future__ import annotations

import json
import re
import subprocess

from tests.support.servers import etcdctl_flags
from tests.support.tls import CLIENT_CN

ROOT = "--user=root:rootpw"
ALICE = "--user=alice:apw"  # readwrite on the prefix /app/
BOB = "--user=bob:bpw"  # read on /conf and on [a, c), write on /logs and everything from /z

SETUP = [
    ["auth", "status"],
    ["user", "add", "root", "--new-user-password=rootpw"],
    ["user", "add", "alice", "--new-user-password=apw"],
    ["user", "add", "bob", "--new-user-password=bpw"],
    ["user", "add", "nopw", "--no-password"],
    ["user", "add", "alice", "--new-user-password=again"],
    ["user", "add", "long", "--new-user-password=" + "x" * 73],
    ["role", "add", "pfx"],
    ["role", "add", "mixed"],
    ["role", "add", "pfx"],
    ["role", "grant-permission", "pfx", "--prefix=true", "readwrite", "/app/"],
    ["role", "grant-permission", "mixed", "read", "/conf"],
    ["role", "grant-permission", "mixed", "read", "a", "c"],
    ["role", "grant-permission", "mixed", "write", "/logs"],
    ["role", "grant-permission", "mixed", "--from-key", "write", "/z"],
    ["role", "grant-permission", "ghost", "read", "/x"],
    ["user", "grant-role", "alice", "pfx"],
    ["user", "grant-role", "bob", "mixed"],
    ["user", "grant-role", "bob", "ghost"],
    ["user", "grant-role", "ghost", "pfx"],
    ["put", "/conf", "c0"],
    ["put", "/app/seed", "s"],
    ["role", "get", "mixed"],
    ["user", "get", "bob", "--detail"],
    ["auth", "status"],
    ["auth", "enable"],
    ["auth", "status"],
]

AS_USERS = [
    ["put", "/app/x", "1"],  # nobody
    ["get", "/conf"],
    [ALICE, "put", "/app/x", "1"],
    [ALICE, "get", "/app/", "--prefix"],
    [ALICE, "get", "/app/x", "-w", "json"],
    [ALICE, "get", "/conf"],
    [ALICE, "put", "/other", "1"],
    [ALICE, "get", "/app/", "--prefix", "--keys-only"],
    [ALICE, "get", "/app/", "/app0"],
    [ALICE, "get", "/app/", "/b"],
    [ALICE, "get", "/app/", "--from-key"],
    [ALICE, "del", "/app/seed", "--prev-kv"],
    [ALICE, "del", "/app/", "--prefix"],
    [ALICE, "put", "/app/y", "2"],
    [ALICE, "txn"],
    # watches: refused at creation outside the permission; from-key on a
    # key of a prefix permission is outside it (etcd 3.7.1's fix)
    [ALICE, "watch", "/other"],
    [ALICE, "watch", "/app/", "--from-key"],
    [ALICE, "watch", "/app/", "--prefix", "--rev", "1"],
    [BOB, "watch", "b", "--rev", "1"],
    [BOB, "watch", "a", "d"],
    [BOB, "get", "/conf"],
    [BOB, "get", "a", "c"],
    [BOB, "get", "b"],
    [BOB, "get", "a", "d"],
    [BOB, "put", "/conf", "2"],
    [BOB, "put", "/logs", "l1"],
    [BOB, "get", "/logs"],
    [BOB, "put", "/zebra", "z"],
    [BOB, "put", "/logs", "l2", "--prev-kv"],
    [BOB, "del", "/logs"],
    [BOB, "del", "/z", "--from-key"],
    ["--user=alice:wrong", "get", "/app/x"],
    ["--user=ghost:x", "get", "/app/x"],
    ["--user=nopw:x", "get", "/app/x"],
    [ROOT, "get", "", "--prefix", "--keys-only"],
    [ROOT, "user", "list"],
    [ROOT, "role", "list"],
    [ROOT, "role", "get", "pfx"],
    [ROOT, "role", "get", "root"],
    [ROOT, "user", "get", "alice", "--detail"],
    [ALICE, "user", "get", "alice"],
    [ALICE, "user", "get", "bob"],
    [ALICE, "role", "get", "pfx"],
    [ALICE, "role", "get", "mixed"],
    [ALICE, "user", "list"],
    [ALICE, "role", "list"],
    [ALICE, "user", "add", "eve", "--new-user-password=e"],
    [ALICE, "role", "add", "evil"],
    [ALICE, "auth", "disable"],
    [ALICE, "compaction", "2"],
    [ALICE, "endpoint", "status", "-w", "json"],
    [ALICE, "endpoint", "hashkv"],
    [ALICE, "alarm", "list"],
    [ALICE, "alarm", "disarm"],
    [ALICE, "defrag"],
    [ALICE, "snapshot", "save", "/nonexistent-dir/refused.db"],
    [ALICE, "member", "add", "x", "--peer-urls=http://127.0.0.1:1"],
    [ALICE, "member", "remove", "1"],
    [ALICE, "move-leader", "1"],
    ["member", "list"],
    [ALICE, "lease", "grant", "60"],
    ["lease", "grant", "60"],
    [ALICE, "lease", "list"],
    [ROOT, "user", "delete", "root"],
    [ROOT, "user", "revoke-role", "root", "root"],
    [ROOT, "role", "delete", "root"],
    [ROOT, "user", "revoke-role", "alice", "mixed"],
    [ROOT, "role", "revoke-permission", "mixed", "/nothing"],
    [ROOT, "role", "revoke-permission", "pfx", "/app/", "--prefix=true"],
    [ALICE, "get", "/app/y"],
    [ROOT, "user", "passwd", "alice", "--new-user-password=apw2"],
    [ALICE, "get", "/app/y"],
    [ROOT, "user", "delete", "bob"],
    [BOB, "get", "/conf"],
    [ROOT, "role", "delete", "mixed"],
    [ROOT, "user", "get", "nopw"],
    [ROOT, "compaction", "3"],
    [ROOT, "auth", "status"],
    [ROOT, "auth", "disable"],
    ["auth", "status"],
    ["get", "/app/y"],
]

# Over mutual TLS, as the client certificate's common name (no --user): the
# name's prefix is granted, the rest refused; root and nobody by password.
CN_SESSION = [
    ["user", "add", "root", "--new-user-password=rootpw"],
    ["user", "grant-role", "root", "root"],
    ["role", "add", "root"],
    ["user", "add", CLIENT_CN, "--no-password"],
    ["role", "add", "cn"],
    ["role", "grant-permission", "cn", "--prefix=true", "readwrite", "/cn/"],
    ["user", "grant-role", CLIENT_CN, "cn"],
    ["auth", "enable"],
    ["put", "/cn/a", "1"],  # as the certificate's common name
    ["get", "/cn/", "--prefix"],
    ["put", "/x", "1"],
    ["user", "list"],
    [ROOT, "user", "list"],
    [ROOT, "put", "/x", "1"],
    ["--user=nobody:x", "get", "/cn/a"],
    [ROOT, "auth", "disable"],
]


# etcdctl txn reads its operations from stdin.
TXN_INPUT = 'value("/app/y") = "2"\n\nput /app/z 3\nget /other\n\nput /app/z 4\n\n'

_CLIENT_LOG = re.compile(r"^\{.*\}$")
_IDS = re.compile(r'"(cluster_id|member_id|raft_term|ID|id)":\d+')


_ENDPOINT = re.compile(r"127\.0\.0\.1:\d+")


def _normal_stderr(text: str) -> str:
    text = re.sub(r"took [0-9.]+[mµu]?s", "took <time>", _ENDPOINT.sub("<endpoint>", text))
    out = []
    for line in text.splitlines():
        if _CLIENT_LOG.match(line):
            entry = json.loads(line)
            line = json.dumps({k: entry.get(k) for k in ("level", "msg", "method", "error")}, sort_keys=True)
        out.append(line)
    return "\n".join(out)


def _normal_stdout(text: str) -> str:
    text = _ENDPOINT.sub("<endpoint>", _IDS.sub(r'"\1":<id>', text))
    return re.sub(r"\b[0-9a-f]{16}\b", "<lease id>", text)


def run_session(ctl: str, endpoint, steps, extra=()) -> list[tuple]:
    """Each step's (args, exit code, stdout, stderr), normalized.  Given a
    list of endpoints (a cluster's members), step i goes to endpoint i mod
    their number alone: each step through another member than the step
    before it."""
    endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
    out = []
    for i, args in enumerate(steps):
        endpoint = endpoints[i % len(endpoints)]
        stdin = TXN_INPUT if "txn" in args else None
        command = [ctl, f"--endpoints={endpoint}", *etcdctl_flags(endpoint), *extra, *args]
        if "watch" in args:  # a watch that was made goes on: what it printed in 3 s
            command = ["timeout", "-s", "INT", "3", *command]
        r = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60)
        stdout = _normal_stdout(r.stdout)
        if "endpoint" in args and "status" in args:
            stdout = re.sub(r'"(Endpoint|version|dbSize\w*|leader|raftIndex|raftAppliedIndex|dbSizeInUse|'
                            r'revision|storageVersion|dbSizeQuota|raftTerm)":("[^"]*"|\d+)', r'"\1":<x>', stdout)
        if "hashkv" in args and r.returncode == 0:
            stdout = "<hash>"
        out.append((args, r.returncode, stdout, _normal_stderr(r.stderr)))
    return out


# Steps where etcd 3.6 answers otherwise than 3.7 (and brain, as 3.7): with
# auth on, 3.6 refuses AuthStatus without a user ("user name is empty"),
# 3.7 answers it.
KNOWN_36_DIFFERENCES = [["auth", "status"]]
