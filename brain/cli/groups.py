"""`brain groups`: brain as several groups, each an ordinary `brain serve`
owning a set of Kubernetes resources, and the kube-apiserver flags that
send each resource to its group.

A brain decides its writes on one Python thread, so one brain uses about
one core; kube-apiserver already splits its storage by resource
(--etcd-servers-overrides), so a brain per group of resources uses a core
each (docs/groups.md says when to split and what a group costs).

    brain groups --group leases-events=coordination.k8s.io/leases,/events,events.k8s.io/events
    brain groups --layout groups.toml                    # start, supervise; Ctrl-C stops them
    brain groups --layout groups.toml --print-flags      # kube-apiserver's flags, nothing started
    brain groups --layout groups.toml --print-commands   # each group's `brain serve`, to run elsewhere
    brain groups --layout groups.toml --write-env DIR    # DIR/<group>.env for deploy/groups/brain-group@.service
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path
from typing import Sequence

from brain.cli import group_layout
from brain.cli.flags import seconds_type
from brain.cli.group_layout import Layout, LayoutError

# Per-group settings as flags: --FLAG NAME=VALUE (the layout file's keys of the same names).
PER_GROUP = ("listen-client-urls", "advertise-client-urls", "listen-metrics-urls", "data-dir", "journal-url",
             "endpoints")
_ENV_SAFE = re.compile(r"[A-Za-z0-9_./:,@%+=-]*")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="brain groups", allow_abbrev=False,
        description="Run brain as several groups, each an ordinary `brain serve` owning some Kubernetes "
                    "resources, and print kube-apiserver's --etcd-servers and --etcd-servers-overrides for them.",
        epilog="A layout comes from --layout or from the flags (docs/groups.md).  Without --print-flags, "
               "--print-commands or --write-env the groups run on this machine, supervised, until SIGTERM or "
               "Ctrl-C.")
    p.add_argument("--layout", metavar="FILE", help="the layout, a TOML file (instead of the flags below)")
    p.add_argument("--group", action="append", default=[], metavar="NAME=RESOURCE,...",
                   help="a group and the resources it owns, as kube-apiserver names them (group/resource; "
                        "the core group is empty: /events); a NAME alone is the default group, which owns "
                        "everything not moved (one called default is added when none is given)")
    for key in PER_GROUP:
        p.add_argument(f"--{key}", action="append", default=[], metavar="NAME=VALUE",
                       help=_PER_GROUP_HELP[key])
    p.add_argument("--serve-flag", action="append", default=[], metavar="FLAG=VALUE",
                   help="a `brain serve` flag for every group, e.g. quota-backend-bytes=8589934592 or "
                        "client-cert-auth=true")
    p.add_argument("--data-root", metavar="DIR", help=f"the groups' logs (DIR/NAME.log) and data dirs (DIR/NAME) "
                                                      f"unless given (default {group_layout.DEFAULT_DATA_ROOT})")
    p.add_argument("--restart-delay", type=seconds_type, default=5.0,
                   help="seconds before a group that died is started again; negative: it is left down "
                        "(default %(default)g)")
    p.add_argument("--start-timeout", type=seconds_type, default=300.0,
                   help="how long every group may take to serve at the start (default %(default)g s)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--print-flags", action="store_true",
                      help="print kube-apiserver's flags for the layout, one a line, and exit")
    mode.add_argument("--print-commands", action="store_true",
                      help="print each group's `brain serve` command (to start it on another machine) and exit")
    mode.add_argument("--write-env", metavar="DIR",
                      help="write DIR/NAME.env per group (its `brain serve` flags as BRAIN_* variables, for "
                           "deploy/groups/brain-group@.service), print kube-apiserver's flags, and exit")
    return p


_PER_GROUP_HELP = {
    "listen-client-urls": "a group's client URLs (default http://localhost:2379 for the default group, 100 "
                          "ports higher for each further group)",
    "advertise-client-urls": "a group's advertised client URLs",
    "listen-metrics-urls": "a group's /metrics and /readyz URLs (default: 2 above a default client port)",
    "data-dir": "a group's data dir (default DATA_ROOT/NAME)",
    "journal-url": "a replicated group's journal, nats://host:4222,.../NAME (docs/cluster.md); a name of its own "
                   "per group",
    "endpoints": "the client URLs kube-apiserver is given for a group, all its replicas' (default: its "
                 "advertised, else its listen URLs)",
}


def layout_from_args(args: argparse.Namespace) -> Layout:
    per_group = {key: getattr(args, key.replace("-", "_")) for key in PER_GROUP}
    if args.layout:
        given = [f"--{k}" for k, v in per_group.items() if v] + (["--group"] if args.group else []) \
            + (["--serve-flag"] if args.serve_flag else []) + (["--data-root"] if args.data_root else [])
        if given:
            raise LayoutError(f"--layout and {' '.join(given)}: give the groups in the file or as flags, not both")
        return group_layout.load(args.layout)
    return group_layout.from_flags(args.group, {k: v for k, v in per_group.items() if v}, args.serve_flag,
                                   args.data_root or group_layout.DEFAULT_DATA_ROOT)


def env_file(layout: Layout, name: str) -> str:
    """A group's `brain serve` flags as BRAIN_<FLAG> variables (brain serve reads them; systemd's
    EnvironmentFile= syntax)."""
    g = layout.group(name)
    lines = [f"# brain group {g.name}: {g.describe_resources()}",
             "# written by `brain groups --write-env`; read by deploy/groups/brain-group@.service "
             f"(brain-group@{g.name})"]
    for flag, value in g.flags:
        if not _ENV_SAFE.fullmatch(value):
            value = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines.append(f"BRAIN_{flag.upper().replace('-', '_')}={value}")
    return "\n".join(lines) + "\n"


def commands(layout: Layout) -> str:
    out = []
    for g in layout.groups:
        out.append(f"# {g.name}: {g.describe_resources()}")
        out.append(shlex.join(["brain", "serve", *g.serve_args()]))
    return "\n".join(out) + "\n"


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    try:
        layout = layout_from_args(args)
    except LayoutError as e:
        print(f"brain groups: {e}", file=sys.stderr)
        return 2
    if args.print_flags:
        print("\n".join(layout.apiserver_flags()))
        return 0
    if args.print_commands:
        sys.stdout.write(commands(layout))
        return 0
    if args.write_env:
        out = Path(args.write_env)
        out.mkdir(parents=True, exist_ok=True)
        for g in layout.groups:
            (out / f"{g.name}.env").write_text(env_file(layout, g.name))
            print(f"wrote {out / f'{g.name}.env'} (systemctl enable --now brain-group@{g.name})")
        print("kube-apiserver flags:")
        for flag in layout.apiserver_flags():
            print(f"  {flag}")
        return 0
    from brain.cli.group_supervisor import Supervisor

    return Supervisor(layout, restart_delay=args.restart_delay, start_timeout=args.start_timeout).run()
