#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and
# kwok from the versions pinned in tests/k8s/go.mod into a cache directory
# keyed by version:  <repo>/.cache/k8s/<k8s-version>-kwok-<kwok-version>/bin
#
# kubectl is built too: Debian's kubernetes-client is 1.20, far outside the
# supported client skew for a 1.37 apiserver.
#
# It also writes <cache>/kwok-stages.yaml, kwok's default Stage set read from
# the pinned kwok module (the kwok binary needs them in --config).
#
# A second run finds the binaries (and a stamp of go.mod/go.sum/this script)
# and returns at once. Prints the bin directory on stdout as its last line.
#
#   tests/k8s/build.sh            build if needed, print the bin dir
#   tests/k8s/build.sh --force    rebuild even if the cache is complete
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
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)

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

# What the output depends on (not this script's prose): worktrees sharing
# BRAIN_K8S_CACHE agree on the stamp unless the build itself differs.
stamp_of_inputs() {
    { cat "$here/go.mod" "$here/go.sum"; go version; echo "${binaries[*]} ${stages[*]} $ldflags"; } \
        | sha256sum | cut -d' ' -f1
}
stamp="$(stamp_of_inputs)"

complete=1
for b in "${binaries[@]}"; do
    [[ -x "$bin/$b" ]] || complete=0
done
[[ -f "$out/kwok-stages.yaml" ]] || complete=0
if [[ $force == 0 && $complete == 1 && -f "$out/stamp" && "$(cat "$out/stamp")" == "$stamp" ]]; then
    echo "build.sh: cached $k8s_version / kwok $kwok_version in $bin" >&2
    echo "$bin"
    exit 0
fi

jobs="${BRAIN_K8S_JOBS:-2}"
export GOMAXPROCS="$jobs"
export CGO_ENABLED=0
# -mod=mod lets go fill go.sum for the tool packages if an entry is missing;
# -buildvcs=false because the module lives inside brain's git tree.
export GOFLAGS="-mod=mod -buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

ldflags="${ldflags//BUILD_DATE/$(date -u +%Y-%m-%dT%H:%M:%SZ)}"

mkdir -p "$bin"
rm -f "$out/stamp"
# Build into a private staging dir and rename each file into place whole:
# several builds may share the cache at once, and a reader must see either
# the old binary or the new one, never a partial file.
stage="$(mktemp -d "$out/stage.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
echo "build.sh: building $k8s_version / kwok $kwok_version into $bin (go build -p $jobs)" >&2
start=$(date +%s)
(
    cd "$here"
    go build -p "$jobs" -trimpath -ldflags "$ldflags" -o "$stage/" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler \
        k8s.io/kubernetes/cmd/kubectl \
        sigs.k8s.io/kwok/cmd/kwok
)
echo "build.sh: built in $(( $(date +%s) - start )) s" >&2
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
for b in "${binaries[@]}"; do
    mv -f "$stage/$b" "$bin/$b"
done
mv -f "$stage/kwok-stages.yaml" "$out/kwok-stages.yaml"
echo "$stamp" > "$stage/stamp"
mv -f "$stage/stamp" "$out/stamp"
echo "$bin"
