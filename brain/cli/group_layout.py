"""The layout `brain groups` runs: which Kubernetes resources each group
owns, each group's `brain serve` flags, and the kube-apiserver flags that
send every resource to its group.

kube-apiserver splits its storage by resource: `--etcd-servers` for
everything, `--etcd-servers-overrides=group/resource#url;url,...` for the
resources moved elsewhere (k8s.io/apiserver pkg/server/options/etcd.go,
ParseEtcdServersOverrides; the core group is the empty one: `/events`).  A
group is one ordinary brain, a single node or a replicated cluster, so it
keeps a revision sequence of its own: since KEP-5504 (GA in 1.35) the
apiserver compares resourceVersions only within a resource.

A layout comes from a TOML file or from `brain groups`' flags
(docs/groups.md); both make the same `Layout`, checked whole (every group's
`brain serve` flags included) before anything starts.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

DEFAULT_GROUP = "default"
DEFAULT_DATA_ROOT = "groups.brain"
# Client ports of groups whose URLs are not given: etcd's 2379 for the default
# group, 100 more for each further group in layout order; metrics 2 above
# (2381, where etcd's --listen-metrics-urls usually is).
FIRST_CLIENT_PORT = 2379
PORT_STEP = 100
METRICS_OFFSET = 2

# A group's keys that are the layout's own; every other key is a `brain serve` flag.
LAYOUT_KEYS = ("name", "resources", "endpoints", "member-name")
# `brain serve` flags that name one process: given per group, never for every group.
PER_GROUP_FLAGS = ("name", "data-dir", "listen-client-urls", "advertise-client-urls", "listen-metrics-urls",
                   "journal-url")
# Characters kube-apiserver's override syntax gives a meaning: no endpoint may hold one.
OVERRIDE_SEPARATORS = ("#", ";", ",")

# kube-apiserver keeps some resources in the storage of another, their
# "cohabitating" resource (pkg/kubeapiserver/default_storage_factory_builder.go,
# v1.37: the first of each pair whose API group is served; these always
# are).  An override must name that one: an override of the other alone is
# never read.
STORED_WITH = {
    "events.k8s.io/events": "/events",
    "extensions/replicationcontrollers": "/replicationcontrollers",
    "extensions/deployments": "apps/deployments",
    "extensions/daemonsets": "apps/daemonsets",
    "extensions/replicasets": "apps/replicasets",
    "extensions/networkpolicies": "networking.k8s.io/networkpolicies",
    "extensions/ingresses": "networking.k8s.io/ingresses",
    "extensions/podsecuritypolicies": "policy/podsecuritypolicies",
}

_GROUP_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_API_GROUP = re.compile(r"([a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*)?")
_RESOURCE = re.compile(r"[a-z][a-z0-9]*")


class LayoutError(ValueError):
    """A layout that cannot run; the message names the group and the key."""


@dataclass(frozen=True)
class Resource:
    """A resource as kube-apiserver names it in an override: API group ("" for core) and resource."""

    group: str
    resource: str

    def __str__(self) -> str:
        return f"{self.group}/{self.resource}"


def parse_resource(text: str) -> Resource:
    """``group/resource`` (``/events`` for the core group's), as kube-apiserver's override takes it."""
    raw = text.strip()
    if "/" not in raw:
        raise LayoutError(f"resource {raw!r}: write it group/resource, as kube-apiserver's "
                          f"--etcd-servers-overrides does (the core group is the empty one: /{raw})")
    group, _, resource = raw.partition("/")
    if resource == "*":
        raise LayoutError(f"resource {raw!r}: name the resources one by one (a group's '*' would move its "
                          "resources compiled into kube-apiserver, but not the ones named elsewhere)")
    if not _API_GROUP.fullmatch(group) or not _RESOURCE.fullmatch(resource):
        raise LayoutError(f"resource {raw!r}: expected group/resource, e.g. coordination.k8s.io/leases or /events "
                          "(lower case, the resource in the plural)")
    return Resource(group, resource)


def storage_resource(r: Resource) -> Resource:
    """The resource whose storage ``r`` lives in (``r`` itself but for kube-apiserver's pairs)."""
    other = STORED_WITH.get(str(r))
    return parse_resource(other) if other else r


@dataclass(frozen=True)
class Group:
    """One group: the resources it owns (none: the default group, which has
    everything not moved), the flags of its `brain serve`, and the client URLs
    kube-apiserver reaches it by."""

    name: str
    resources: tuple[Resource, ...]
    flags: tuple[tuple[str, str], ...]  # (flag without dashes, value), in the command's order
    endpoints: tuple[str, ...]

    @property
    def is_default(self) -> bool:
        return not self.resources

    @property
    def stored(self) -> tuple[Resource, ...]:
        """The resources the apiserver's overrides name for this group: each one's storage resource, once."""
        out: list[Resource] = []
        for r in self.resources:
            s = storage_resource(r)
            if s not in out:
                out.append(s)
        return tuple(out)

    def flag(self, name: str) -> str:
        """A flag's value ("" when not given)."""
        return dict(self.flags).get(name, "")

    def serve_args(self) -> list[str]:
        """The flags of this group's `brain serve`."""
        return [f"--{k}={v}" for k, v in self.flags]

    @property
    def client_urls(self) -> list[str]:
        return _split(self.flag("listen-client-urls"))

    @property
    def metrics_urls(self) -> list[str]:
        return _split(self.flag("listen-metrics-urls"))

    @property
    def data_dir(self) -> str:
        return self.flag("data-dir")

    def describe_resources(self) -> str:
        return " ".join(map(str, self.resources)) if self.resources else "everything not moved"


@dataclass(frozen=True)
class Layout:
    groups: tuple[Group, ...]
    data_root: str  # the groups' logs; their data dirs unless given

    @property
    def default(self) -> Group:
        return next(g for g in self.groups if g.is_default)

    def group(self, name: str) -> Group:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def log_path(self, group: Group) -> Path:
        return Path(self.data_root) / f"{group.name}.log"

    def apiserver_flags(self) -> list[str]:
        """kube-apiserver's flags for this layout: the default group in
        --etcd-servers (URLs comma-separated), one override per resource moved
        (its group's URLs semicolon-separated), every override in one flag."""
        flags = [f"--etcd-servers={','.join(self.default.endpoints)}"]
        overrides = [f"{r}#{';'.join(g.endpoints)}" for g in self.groups if not g.is_default for r in g.stored]
        if overrides:
            flags.append(f"--etcd-servers-overrides={','.join(overrides)}")
        return flags

    def notes(self) -> list[str]:
        """What the flags do that the layout does not say in so many words."""
        out = []
        for g in self.groups:
            for r in g.resources:
                s = storage_resource(r)
                if s != r:
                    out.append(f"{r} is stored with {s} (kube-apiserver keeps them together): the override of {s} "
                               f"moves both to {g.name}")
        return out


def _split(text: str) -> list[str]:
    return [u.strip() for u in text.split(",") if u.strip()]


def _flag_value(where: str, key: str, value: object) -> str:
    """A TOML value as `brain serve` takes it on its command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, (str, int)) for v in value):
        return ",".join(str(v) for v in value)
    raise LayoutError(f"{where}: {key} = {value!r}: a string, number, boolean or list of strings")


@dataclass
class GroupSpec:
    """A group as written, before the defaults and the checks: its name, its
    resources and its settings (layout keys and `brain serve` flags)."""

    name: str
    resources: list[str]
    settings: dict[str, object]


def build(specs: list[GroupSpec], common: dict[str, object], data_root: str = DEFAULT_DATA_ROOT) -> Layout:
    """The layout of ``specs`` (in order), with ``common`` `brain serve` flags for every group, checked."""
    from brain.cli import serve_args

    known = set(serve_args.flag_names())
    for key in common:
        if key in PER_GROUP_FLAGS:
            raise LayoutError(f"serve flags for every group: {key} names one process; give it per group")
        if key not in known:
            raise LayoutError(f"serve flags for every group: {key} is not a `brain serve` flag")
    names = [s.name for s in specs]
    for s in specs:
        if not _GROUP_NAME.fullmatch(s.name):
            raise LayoutError(f"group name {s.name!r}: lower-case letters, digits and '-' (it names files and "
                              "systemd units)")
        if names.count(s.name) > 1:
            raise LayoutError(f"group {s.name} is given twice")
    defaults = [s.name for s in specs if not s.resources]
    if len(defaults) != 1:
        raise LayoutError("exactly one group must have no resources (the default group: everything not moved); "
                          + (f"these have none: {', '.join(defaults)}" if defaults else "every group has some"))
    ordered = sorted(specs, key=lambda s: bool(s.resources))  # the default group first: port 2379
    groups = {}
    owner: dict[Resource, str] = {}
    for index, s in enumerate(ordered):
        g = _group(s, index, common, known, data_root)
        for r in g.stored:
            if r in owner:
                raise LayoutError(f"resource {r} is in groups {owner[r]} and {g.name}"
                                  + _stored_note(s.resources, r))
            owner[r] = g.name
        groups[s.name] = g
    layout = Layout(tuple(groups[n] for n in names), data_root)
    _check_distinct(layout)
    for g in layout.groups:
        _check_serve_flags(g)
    return layout


def _stored_note(given: list[str], r: Resource) -> str:
    aliases = [x for x in given if x.strip() != str(r) and storage_resource(parse_resource(x)) == r]
    return f" ({aliases[0]} is stored with {r})" if aliases else ""


def _group(s: GroupSpec, index: int, common: dict[str, object], known: set[str], data_root: str) -> Group:
    where = f"group {s.name}"
    resources = tuple(parse_resource(x) for x in s.resources)
    flags: dict[str, str] = {"name": s.name}
    for key, value in common.items():
        flags[key] = _flag_value("serve flags for every group", key, value)
    endpoints: list[str] = []
    for key, value in s.settings.items():
        if key in ("name", "resources"):
            continue
        if key == "endpoints":
            endpoints = _split(_flag_value(where, key, value))
        elif key == "member-name":
            flags["name"] = _flag_value(where, key, value)
        elif key in known:
            flags[key] = _flag_value(where, key, value)
        else:
            raise LayoutError(f"{where}: {key} is neither a layout key ({', '.join(LAYOUT_KEYS)}) nor a "
                              "`brain serve` flag")
    flags.setdefault("data-dir", str(Path(data_root) / s.name))
    if "listen-client-urls" not in flags:
        port = FIRST_CLIENT_PORT + PORT_STEP * index
        flags["listen-client-urls"] = f"http://localhost:{port}"
        flags.setdefault("listen-metrics-urls", f"http://localhost:{port + METRICS_OFFSET}")
    if not endpoints:
        endpoints = _split(flags.get("advertise-client-urls", "")) or _split(flags["listen-client-urls"])
        wildcard = [u for u in endpoints if re.match(r"^\w+://(0\.0\.0\.0|\[::\]|::)(:|$)", u)]
        if wildcard:
            raise LayoutError(f"{where}: it listens on {wildcard[0]}, which kube-apiserver cannot dial: give "
                              "advertise-client-urls (or endpoints) with the address it is reached at")
    for e in endpoints:
        if any(c in e for c in OVERRIDE_SEPARATORS):
            raise LayoutError(f"{where}: endpoint {e!r} holds one of {' '.join(OVERRIDE_SEPARATORS)}, which "
                              "separate kube-apiserver's overrides")
    return Group(s.name, resources, tuple(flags.items()), tuple(endpoints))


def _check_distinct(layout: Layout) -> None:
    """No two groups listen at one address, share a data dir or a journal."""
    from brain.config import ConfigError, parse_listen_url
    from brain.journal.natsio import parse_journal_url

    seen: dict[tuple[str, str], str] = {}

    def claim(kind: str, value: str, group: Group) -> None:
        other = seen.setdefault((kind, value), group.name)
        if other != group.name:
            raise LayoutError(f"groups {other} and {group.name} have the same {kind}: {value}")

    journals: list[tuple[set[str], str, str]] = []
    for g in layout.groups:
        for url in g.client_urls + g.metrics_urls:
            try:
                claim("listen address", parse_listen_url(url).address, g)
            except ConfigError as e:
                raise LayoutError(f"group {g.name}: {e}") from None
        claim("data dir", os.path.abspath(g.data_dir), g)
        if g.flag("journal-url"):
            try:
                servers, name = parse_journal_url(g.flag("journal-url"))
            except ValueError as e:
                raise LayoutError(f"group {g.name}: {e}") from None
            for other_servers, other_name, other in journals:
                if name == other_name and other_servers & set(servers):
                    raise LayoutError(f"groups {other} and {g.name} would be one cluster: their journal URLs name "
                                      f"the same NATS servers and cluster name {name!r} (each group needs a name "
                                      "of its own after the '/')")
            journals.append((set(servers), name, g.name))


def _check_serve_flags(g: Group) -> None:
    """`brain serve` takes the group's flags: parsed and checked as serve checks them, nothing started."""
    from brain.cli import serve_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            serve_args.parse_serve(["serve", *g.serve_args()], environ={})
    except SystemExit:
        lines = [ln for ln in err.getvalue().strip().splitlines() if ln and not ln.startswith("usage:")]
        detail = lines[-1] if lines else "refused"
        raise LayoutError(f"group {g.name}: brain serve {' '.join(g.serve_args())}: {detail}") from None


# ---------------------------------------------------------------------------
# where a layout comes from
# ---------------------------------------------------------------------------


def load(path: str | Path) -> Layout:
    """A layout file (TOML): ``data-root``, a ``[serve]`` table of flags for
    every group, and one ``[[group]]`` table per group."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise LayoutError(f"{path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise LayoutError(f"{path}: {e}") from None
    extra = set(doc) - {"data-root", "serve", "group"}
    if extra:
        raise LayoutError(f"{path}: unknown key {sorted(extra)[0]!r} (data-root, [serve], [[group]])")
    tables = doc.get("group")
    if not isinstance(tables, list) or not tables:
        raise LayoutError(f"{path}: no [[group]] table")
    specs = []
    for i, t in enumerate(tables, 1):
        name = t.get("name")
        if not isinstance(name, str):
            raise LayoutError(f"{path}: group {i} has no name")
        resources = t.get("resources", [])
        if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
            raise LayoutError(f"{path}: group {name}: resources must be a list of strings")
        specs.append(GroupSpec(name, resources, dict(t)))
    common = doc.get("serve", {})
    if not isinstance(common, dict):
        raise LayoutError(f"{path}: serve must be a table of brain serve flags")
    root = doc.get("data-root", DEFAULT_DATA_ROOT)
    if not isinstance(root, str) or not root:
        raise LayoutError(f"{path}: data-root must be a directory")
    try:
        return build(specs, common, root)
    except LayoutError as e:
        raise LayoutError(f"{path}: {e}") from None


def from_flags(groups: list[str], per_group: dict[str, list[str]], serve_flags: list[str],
               data_root: str = DEFAULT_DATA_ROOT) -> Layout:
    """A layout from `brain groups`' flags: ``groups`` as ``NAME=RESOURCE,...``
    (a NAME alone: the default group; one called ``default`` when none is
    given); ``per_group`` maps a setting (``listen-client-urls``, ...) to its
    ``NAME=VALUE`` entries; ``serve_flags`` are ``FLAG=VALUE`` for every group."""
    specs: list[GroupSpec] = []
    for text in groups:
        name, _, resources = text.partition("=")
        specs.append(GroupSpec(name.strip(), [r for r in (x.strip() for x in resources.split(",")) if r], {}))
    if not any(not s.resources for s in specs):
        specs.insert(0, GroupSpec(DEFAULT_GROUP, [], {}))
    by_name = {s.name: s for s in specs}
    for key, entries in per_group.items():
        for text in entries:
            name, sep, value = text.partition("=")
            if not sep:
                raise LayoutError(f"--{key} {text}: write it NAME=VALUE, NAME being a group's")
            if name not in by_name:
                raise LayoutError(f"--{key} {text}: there is no group {name!r} (groups: {', '.join(by_name)})")
            by_name[name].settings[key] = value
    common: dict[str, object] = {}
    for text in serve_flags:
        key, sep, value = text.partition("=")
        if not sep:
            raise LayoutError(f"--serve-flag {text}: write it FLAG=VALUE (a boolean flag: FLAG=true)")
        common[key.strip().removeprefix("--")] = value
    return build(specs, common, data_root)
