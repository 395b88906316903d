"""brain.cli.group_layout and `brain groups`' printing modes: a layout from
flags or a file, its defaults and checks, kube-apiserver's flags in the
syntax kube-apiserver parses, each group's `brain serve` command and its
environment file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from brain.cli import group_layout as L
from brain.cli import groups, serve_args

REPO = Path(__file__).resolve().parents[2]
LEASES_EVENTS = "leases-events=coordination.k8s.io/leases,/events,events.k8s.io/events"


def kube_apiserver_overrides(flags: list[str]) -> tuple[list[str], dict[tuple[str, str], list[str]]]:
    """kube-apiserver's reading of its storage flags (k8s.io/apiserver pkg/server/options/etcd.go
    ParseEtcdServersOverrides, after pflag's comma-separated StringSlice): (--etcd-servers,
    {(group, resource): servers}); an entry it would refuse raises."""
    servers, overrides = [], {}
    for flag in flags:
        name, _, value = flag.partition("=")
        if name == "--etcd-servers":
            servers = value.split(",")
        elif name == "--etcd-servers-overrides":
            for entry in value.split(","):
                tokens = entry.split("#")
                assert len(tokens) == 2, entry
                api = tokens[0].split("/")
                assert len(api) == 2, entry
                urls = tokens[1].split(";")
                assert all(urls), entry
                overrides[(api[0], api[1])] = urls
        else:
            raise AssertionError(f"not a storage flag: {flag}")
    return servers, overrides


def test_two_groups_from_flags_get_etcds_ports_data_dirs_and_the_apiservers_flags():
    layout = L.from_flags([LEASES_EVENTS], {}, [])
    assert [g.name for g in layout.groups] == ["default", "leases-events"]
    default, moved = layout.groups
    assert default.serve_args() == ["--name=default", "--data-dir=groups.brain/default",
                                    "--listen-client-urls=http://localhost:2379",
                                    "--listen-metrics-urls=http://localhost:2381"]
    assert moved.serve_args() == ["--name=leases-events", "--data-dir=groups.brain/leases-events",
                                  "--listen-client-urls=http://localhost:2479",
                                  "--listen-metrics-urls=http://localhost:2481"]
    assert layout.apiserver_flags() == [
        "--etcd-servers=http://localhost:2379",
        "--etcd-servers-overrides=coordination.k8s.io/leases#http://localhost:2479,/events#http://localhost:2479",
    ]
    assert kube_apiserver_overrides(layout.apiserver_flags()) == (
        ["http://localhost:2379"],
        {("coordination.k8s.io", "leases"): ["http://localhost:2479"], ("", "events"): ["http://localhost:2479"]})


def test_events_k8s_io_events_moves_with_core_events_which_the_override_names():
    # kube-apiserver stores events.k8s.io/events in core events' storage: an override of
    # events.k8s.io/events alone would never be read.
    layout = L.from_flags(["ev=events.k8s.io/events"], {}, [])
    assert layout.apiserver_flags()[1] == "--etcd-servers-overrides=/events#http://localhost:2479"
    assert layout.notes() == ["events.k8s.io/events is stored with /events (kube-apiserver keeps them together): "
                              "the override of /events moves both to ev"]
    with pytest.raises(L.LayoutError, match=r"resource /events is in groups a and b \(events.k8s.io/events is "
                                            r"stored with /events\)"):
        L.from_flags(["a=/events", "b=events.k8s.io/events"], {}, [])


def test_a_replicated_group_gives_the_apiserver_every_replica_semicolon_separated():
    layout = L.from_flags(
        ["main", "pods=/pods"],
        {"listen-client-urls": ["main=https://10.0.0.1:2379", "pods=https://10.0.0.1:2479"],
         "journal-url": ["main=nats://10.0.1.1:4222,10.0.1.2:4222/main", "pods=nats://10.0.1.1:4222/pods"],
         "endpoints": ["main=https://10.0.0.1:2379,https://10.0.0.2:2379",
                       "pods=https://10.0.0.1:2479,https://10.0.0.2:2479,https://10.0.0.3:2479"]},
        ["quota-backend-bytes=8589934592", "client-cert-auth=true", "cert-file=/etc/brain/pki/server.crt",
         "key-file=/etc/brain/pki/server.key", "trusted-ca-file=/etc/brain/pki/ca.crt"])
    assert layout.apiserver_flags() == [
        "--etcd-servers=https://10.0.0.1:2379,https://10.0.0.2:2379",
        "--etcd-servers-overrides=/pods#https://10.0.0.1:2479;https://10.0.0.2:2479;https://10.0.0.3:2479"]
    pods = layout.group("pods")
    assert "--journal-url=nats://10.0.1.1:4222/pods" in pods.serve_args()
    assert "--client-cert-auth=true" in pods.serve_args() and "--quota-backend-bytes=8589934592" in pods.serve_args()
    assert "--listen-metrics-urls" not in " ".join(pods.serve_args())  # no default beside a given client URL
    cfg = serve_args.parse_serve(["serve", *pods.serve_args()], environ={})
    assert cfg.journal_url == "nats://10.0.1.1:4222/pods" and cfg.client_cert_auth is True


def test_a_layout_file_is_the_same_layout_as_its_flags(tmp_path):
    f = tmp_path / "groups.toml"
    f.write_text('''
data-root = "/srv/brain"

[serve]
quota-backend-bytes = 8589934592
socket-reuse-port = true

[[group]]
name = "main"

[[group]]
name = "leases-events"
resources = ["coordination.k8s.io/leases", "/events", "events.k8s.io/events"]
listen-client-urls = ["http://127.0.0.1:2479", "unix:///run/brain/le.sock"]
''')
    from_file = L.load(f)
    from_flags = L.from_flags(
        ["main", LEASES_EVENTS],
        {"listen-client-urls": ["leases-events=http://127.0.0.1:2479,unix:///run/brain/le.sock"]},
        ["quota-backend-bytes=8589934592", "socket-reuse-port=true"], "/srv/brain")
    assert from_file == from_flags
    le = from_file.group("leases-events")
    assert from_file.group("main").data_dir == "/srv/brain/main"
    assert from_file.log_path(le) == Path("/srv/brain/leases-events.log")


def test_member_name_names_the_replica_and_not_the_group(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('[[group]]\nname = "main"\n[[group]]\nname = "le"\nresources = ["/events"]\nmember-name = "n1"\n')
    le = L.load(f).group("le")
    assert le.name == "le" and le.flag("name") == "n1" and le.data_dir == "groups.brain/le"


@pytest.mark.parametrize("groups_, per_group, serve, message", [
    (["a=events"], {}, [],
     r"resource 'events': write it group/resource, .*\(the core group is the empty one: /events\)"),
    (["a=apps/*"], {}, [], r"name the resources one by one"),
    (["a=Apps/Deployments"], {}, [], r"expected group/resource"),
    (["a=/pods", "b=/pods"], {}, [], r"resource /pods is in groups a and b"),
    (["main", "other"], {}, [], r"exactly one group must have no resources .* these have none: main, other"),
    (["Bad_Name=/pods"], {}, [], r"group name 'Bad_Name'"),
    (["a=/pods", "a=/events"], {}, [], r"group a is given twice"),
    (["a=/pods"], {"data-dir": ["b=/x"]}, [], r"there is no group 'b'"),
    (["a=/pods"], {"data-dir": ["a"]}, [], r"write it NAME=VALUE"),
    (["a=/pods"], {}, ["data-dir=/x"], r"data-dir names one process; give it per group"),
    (["a=/pods"], {}, ["no-such-flag=1"], r"no-such-flag is not a `brain serve` flag"),
    (["a=/pods"], {}, ["quota-backend-bytes=lots"], r"group default: brain serve .*invalid integer 'lots'"),
    (["a=/pods"], {"listen-client-urls": ["a=http://127.0.0.1:2379"]}, [],
     r"groups default and a have the same listen address: 127.0.0.1:2379"),
    (["a=/pods"], {"data-dir": ["a=groups.brain/default"]}, [], r"groups default and a have the same data dir"),
    (["a=/pods"], {"journal-url": ["default=nats://n1:4222,n2:4222/x", "a=nats://n2:4222/x"]}, [],
     r"groups default and a would be one cluster"),
    (["a=/pods"], {"listen-client-urls": ["a=http://0.0.0.0:2479"]}, [], r"listens on http://0.0.0.0:2479, which "
                                                                         r"kube-apiserver cannot dial"),
    (["a=/pods"], {"endpoints": ["a=http://h:1#x"]}, [], r"endpoint 'http://h:1#x' holds one of"),
])
def test_a_layout_that_cannot_run_is_refused_naming_why(groups_, per_group, serve, message):
    with pytest.raises(L.LayoutError, match=message):
        L.from_flags(groups_, per_group, serve)


def test_layout_file_problems_name_the_file(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('[[group]]\nname = "main"\nlisten-client-url = "http://x:1"\n')
    with pytest.raises(L.LayoutError, match=r"g.toml: group main: listen-client-url is neither a layout key"):
        L.load(f)
    f.write_text('[[group]]\nname = "main"\n[[groups]]\n')
    with pytest.raises(L.LayoutError, match=r"unknown key 'groups'"):
        L.load(f)
    f.write_text('[[group]]\nname = "a"\nresources = ["/pods"]\n')
    with pytest.raises(L.LayoutError, match=r"every group has some"):
        L.load(f)
    with pytest.raises(L.LayoutError, match=r"No such file"):
        L.load(tmp_path / "missing.toml")


def test_an_env_file_is_the_same_brain_serve_as_the_command_line(tmp_path):
    layout = L.from_flags([LEASES_EVENTS], {"journal-url": ["leases-events=nats://n1:4222,n2:4222/le"]},
                          ["quota-backend-bytes=8589934592", "socket-reuse-port=true", "log-format=json"],
                          str(tmp_path / "data dir"))
    for g in layout.groups:
        text = groups.env_file(layout, g.name)
        env = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                env[key] = value[1:-1].replace('\\"', '"').replace("\\\\", "\\") if value.startswith('"') else value
        assert all(k.startswith("BRAIN_") for k in env)
        assert f'BRAIN_DATA_DIR="{tmp_path}/data dir/{g.name}"' in text  # a space: quoted
        from_env = serve_args.parse_serve(["serve"], environ=env)
        assert from_env == serve_args.parse_serve(["serve", *g.serve_args()], environ={})
        assert from_env.socket_reuse_port is True and from_env.quota_backend_bytes == 8589934592


def _brain_groups(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "brain", "groups", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_the_printing_modes_start_nothing(tmp_path):
    r = _brain_groups("--group", LEASES_EVENTS, "--print-flags", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "--etcd-servers=http://localhost:2379",
        "--etcd-servers-overrides=coordination.k8s.io/leases#http://localhost:2479,/events#http://localhost:2479"]
    r = _brain_groups("--group", LEASES_EVENTS, "--print-commands", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "# default: everything not moved",
        "brain serve --name=default --data-dir=groups.brain/default --listen-client-urls=http://localhost:2379 "
        "--listen-metrics-urls=http://localhost:2381",
        "# leases-events: coordination.k8s.io/leases /events events.k8s.io/events",
        "brain serve --name=leases-events --data-dir=groups.brain/leases-events "
        "--listen-client-urls=http://localhost:2479 --listen-metrics-urls=http://localhost:2481"]
    r = _brain_groups("--group", LEASES_EVENTS, "--write-env", "env", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "env").iterdir()) == ["default.env", "leases-events.env"]
    assert "systemctl enable --now brain-group@leases-events" in r.stdout
    assert not (tmp_path / "groups.brain").exists()


def test_a_bad_layout_exits_2_with_the_reason(tmp_path):
    r = _brain_groups("--group", "a=/pods", "--group", "b=/pods", "--print-flags", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == "brain groups: resource /pods is in groups a and b"
    (tmp_path / "g.toml").write_text('[[group]]\nname = "main"\n')
    r = _brain_groups("--layout", "g.toml", "--group", "a=/pods", cwd=tmp_path)
    assert r.returncode == 2 and "give the groups in the file or as flags, not both" in r.stderr


def test_the_docs_examples_print_what_the_docs_show(tmp_path):
    import re
    import shlex

    text = (REPO / "docs" / "groups.md").read_text()
    [(command, shown)] = re.findall(r"```sh\n(brain groups [^\n]*--print-flags)\n```\n+```\n(.*?)```", text, re.S)
    r = _brain_groups(*shlex.split(command)[2:], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == shown
    # the "up" banner the docs show carries the same flags
    [banner] = re.findall(r"```\n(starting 2 groups.*?)```", text, re.S)
    assert [line.strip() for line in banner.splitlines() if line.strip().startswith("--")] == shown.splitlines()
    # the layout file the docs show runs, and moves what it says
    [toml] = re.findall(r"```toml\n(.*?)```", text, re.S)
    (tmp_path / "groups.toml").write_text(toml)
    layout = L.load(tmp_path / "groups.toml")
    assert layout.apiserver_flags() == [
        "--etcd-servers=http://localhost:2379",
        "--etcd-servers-overrides=coordination.k8s.io/leases#http://127.0.0.1:2479,/events#http://127.0.0.1:2479"]
