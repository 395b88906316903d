#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok
# and kubeadm from the versions pinned in tests/k8s/go.mod into a cache
# directory keyed by version:  <repo>/.cache/k8s/<k8s-version>-kwok-<kwok-version>/bin
#
# kubectl is built too: Debian's kubernetes-client is 1.20, far outside the
# supported client skew for a 1.37 apiserver. kubeadm is for its preflight
# checks against brain as external etcd (test_kubeadm.py).
#
# It also writes <cache>/kwok-stages.yaml, kwok's default Stage set read from
# the pinned kwok module (the kwok binary needs them in --config).
#
# The binaries come in two groups with a stamp each (<cache>/stamps/): the
# control plane with kubectl and kwok, and kubeadm. A second run finds each
# group's files as its stamp names them and returns at once; after a change
# to go.mod/go.sum a group is rebuilt only if the versions of the modules its
# packages import changed (go list -deps), so adding a tool to go.mod does not
# rebuild the others. Prints the bin directory on stdout as its last line.
#
#   tests/k8s/build.sh            build what is missing or stale, print the bin dir
#   tests/k8s/build.sh --force    rebuild everything
#
# Environment: BRAIN_K8S_CACHE overrides <repo>/.cache/k8s; BRAIN_K8S_JOBS
# (default 2) is the go build -p and GOMAXPROCS, sized for a 2-core machine.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
force=0
[[ "${1:-}" == "--force" ]] && force=1

# The pinned versions, read from go.mod so there is one place to change them.
k8s_version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")"
kwok_version="$(awk '$1 == "sigs.k8s.io/kwok" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")"
if [[ -z "$k8s_version" || -z "$kwok_version" ]]; then
    echo "build.sh: cannot read the k8s.io/kubernetes or sigs.k8s.io/kwok version from go.mod" >&2
    exit 2
fi

cache_root="${BRAIN_K8S_CACHE:-$repo/.cache/k8s}"
out="$cache_root/${k8s_version}-kwok-${kwok_version}"
bin="$out/bin"

minor="${k8s_version#v}"; minor="${minor#*.}"; minor="${minor%%.*}"
major="${k8s_version#v}"; major="${major%%.*}"
# The same -X flags as Kubernetes' hack/lib/version.sh, so the binaries report
# the real version (/version, --version, and the apiserver's compatibility
# version). The module zip carries no git commit, so gitCommit stays empty.
# BUILD_DATE is filled in at build time (it is left out of the stamp).
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X '$pkg.gitVersion=$k8s_version'"
    ldflags+=" -X '$pkg.gitMajor=$major'"
    ldflags+=" -X '$pkg.gitMinor=$minor'"
    ldflags+=" -X '$pkg.gitCommit='"
    ldflags+=" -X '$pkg.gitTreeState=clean'"
    ldflags+=" -X '$pkg.buildDate=BUILD_DATE'"
done
ldflags+=" -X 'sigs.k8s.io/kwok/pkg/consts.Version=${kwok_version#v}'"
ldflags+=" -X 'sigs.k8s.io/kwok/pkg/consts.PreRelease=GA'"
stages=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
        pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)

export CGO_ENABLED=0
# -mod=mod lets go fill go.sum for the tool packages if an entry is missing;
# -buildvcs=false because the module lives inside brain's git tree.
export GOFLAGS="-mod=mod -buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

# Two groups, each with its own stamp in $out/stamps/<group>, so that adding or
# changing one (kubeadm came later) does not rebuild the other.
group_pkgs_control_plane=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
                          k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl sigs.k8s.io/kwok/cmd/kwok)
group_pkgs_kubeadm=(k8s.io/kubernetes/cmd/kubeadm)
groups=(control_plane kubeadm)

outputs_of() {  # the files a group leaves in the cache
    local -n pkgs="group_pkgs_$1"
    local p
    for p in "${pkgs[@]}"; do echo "$bin/${p##*/}"; done
    [[ $1 == control_plane ]] && echo "$out/kwok-stages.yaml"
    return 0
}

identity_of() {  # size and mtime (ns) of each file: another build's rename changes them
    local f
    for f in "$@"; do stat -c '%s %.9Y' "$f" 2>/dev/null || echo missing; done | tr '\n' ' '
}

recipe_of() {  # what a group's output depends on besides Go modules (not this script's prose)
    local -n pkgs="group_pkgs_$1"
    echo "${pkgs[*]} $ldflags $(go version) $(go env GOOS GOARCH CGO_ENABLED | tr '\n' ' ')"
    [[ $1 == control_plane ]] && echo "${stages[*]}"
    return 0
}

inputs_key() {  # cheap (milliseconds): the recipe and the whole go.mod/go.sum
    { recipe_of "$1"; cat "$here/go.mod" "$here/go.sum"; } | sha256sum | cut -d' ' -f1
}

modules_key() {  # exact (a second or two): the recipe and the versions of the modules the
    # group's packages import, so a go.mod change that only adds another tool (kubeadm's
    # modules) leaves the other group's key as it was
    local -n pkgs="group_pkgs_$1"
    { recipe_of "$1"
      (cd "$here" && go list -deps \
          -f '{{with .Module}}{{.Path}} {{.Version}}{{with .Replace}} => {{.Path}} {{.Version}}{{end}}{{end}}' \
          "${pkgs[@]}") | LC_ALL=C sort -u
    } | sha256sum | cut -d' ' -f1
}

stamp_field() {  # stamp_field <group> <name>
    awk -v k="$2" '$1 == k {sub(/^[^ ]+ /, ""); print; exit}' "$out/stamps/$1" 2>/dev/null
}

write_stamp() {  # write_stamp <group> <inputs key> <modules key> <identity>: renamed into place whole
    local tmp
    tmp="$(mktemp "$out/stamps/.$1.XXXXXX")"
    printf 'inputs %s\nmodules %s\nfiles %s\n' "$2" "$3" "$4" > "$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$out/stamps/$1"
}

mkdir -p "$bin" "$out/stamps"
# A group is cached when its files are the ones its stamp names and either key
# matches; a match on the modules key alone refreshes the inputs key.
stale=()
for g in "${groups[@]}"; do
    mapfile -t files < <(outputs_of "$g")
    ident="$(identity_of "${files[@]}")"
    if [[ $force == 1 || $ident == *missing* || "$(stamp_field "$g" files)" != "$ident" ]]; then
        stale+=("$g")
        continue
    fi
    ikey="$(inputs_key "$g")"
    [[ "$(stamp_field "$g" inputs)" == "$ikey" ]] && continue
    mkey="$(modules_key "$g")"
    if [[ "$(stamp_field "$g" modules)" == "$mkey" ]]; then
        write_stamp "$g" "$ikey" "$mkey" "$ident"
        continue
    fi
    stale+=("$g")
done
if [[ ${#stale[@]} == 0 ]]; then
    echo "build.sh: cached $k8s_version / kwok $kwok_version in $bin" >&2
    echo "$bin"
    exit 0
fi

jobs="${BRAIN_K8S_JOBS:-2}"
export GOMAXPROCS="$jobs"

# Build into a private staging dir and rename each file into place whole:
# several builds may share the cache at once, and a reader must see either
# the old binary or the new one, never a partial file. The stale groups are
# built by one go build, so packages they share are compiled once.
stage="$(mktemp -d "$out/stage.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
pkgs=()
for g in "${stale[@]}"; do
    declare -n group_pkgs="group_pkgs_$g"
    pkgs+=("${group_pkgs[@]}")
    unset -n group_pkgs
    rm -f "$out/stamps/$g"
done
echo "build.sh: building ${pkgs[*]##*/} ($k8s_version / kwok $kwok_version) into $bin (go build -p $jobs)" >&2
start=$(date +%s)
build_ldflags="${ldflags//BUILD_DATE/$(date -u +%Y-%m-%dT%H:%M:%SZ)}"
(cd "$here" && go build -p "$jobs" -trimpath -ldflags "$build_ldflags" -o "$stage/" "${pkgs[@]}")
echo "build.sh: built in $(( $(date +%s) - start )) s" >&2

if [[ " ${stale[*]} " == *" control_plane "* ]]; then
    "$stage/kube-apiserver" --version >&2
    # kwok's binary takes its Stage objects from --config; kwokctl normally writes
    # them. Assemble the same default set (node initialize + lease heartbeat, pod
    # ready/complete/delete) from the pinned kwok module's own files.
    kwok_dir="$(cd "$here" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
    {
        first=1
        for f in "${stages[@]}"; do
            [[ $first == 1 ]] || echo "---"
            first=0
            cat "$kwok_dir/kustomize/stage/$f"
        done
    } > "$stage/kwok-stages.yaml"
fi
for g in "${stale[@]}"; do
    mapfile -t files < <(outputs_of "$g")
    staged=()
    for f in "${files[@]}"; do staged+=("$stage/${f##*/}"); done
    # A rename keeps size and mtime: the identity taken here is the one
    # the cache will show, unless another build replaces the files meanwhile.
    ident="$(identity_of "${staged[@]}")"
    for i in "${!files[@]}"; do mv -f "${staged[$i]}" "${files[$i]}"; done
    write_stamp "$g" "$(inputs_key "$g")" "$(modules_key "$g")" "$ident"
done
echo "$bin"
