#!/usr/bin/env bash
# Build the cluster tests' binaries, each into its own cache:
#
#   nats-server   github.com/nats-io/nats-server/v2@$NATS_VERSION (go install,
#                 the upstream module's own go.mod and go.sum)
#                 -> ${BRAIN_NATS_CACHE:-<repo>/.cache/nats}/nats-server-<version>/nats-server
#   clustercheck  our linearizability / failover / watch checker (tests/cluster/go)
#                 -> ${BRAIN_CLUSTER_CACHE:-<repo>/.cache/cluster}/bin/clustercheck
#   toxiproxy     github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION, the
#                 partition tests' fault injector (go install, upstream go.mod/go.sum)
#                 -> ${BRAIN_CLUSTER_CACHE:-<repo>/.cache/cluster}/toxiproxy-<version>/toxiproxy
#
# Idempotent: a binary is rebuilt only when it is missing or its inputs
# changed (nats-server, toxiproxy: the version; clustercheck: its go.mod, go.sum
# and sources, those of the local modules its go.mod replaces, and this
# script). Concurrent runs cannot corrupt a cache: a build
# goes into a fresh temporary directory inside the cache and is renamed into
# place (rename(2) is atomic within one filesystem), and a lock file makes a
# second run wait for the first and then find the binary cached.
#
# Prints one line per binary on stdout, "<name> built|cached <seconds> s <path>".
#
#   tests/cluster/build.sh                 build what is missing or stale (both)
#   tests/cluster/build.sh --force         rebuild
#   tests/cluster/build.sh [--force] NAME  only nats-server, clustercheck or toxiproxy
#   tests/cluster/build.sh --go-test       also run clustercheck's Go unit tests
#
# Environment: BRAIN_NATS_CACHE, BRAIN_CLUSTER_CACHE (the cache directories);
# the Go build and module caches live under each (go-build/, gomod/) unless
# GOCACHE or GOMODCACHE are set; BRAIN_CLUSTER_JOBS (default 2) is the go
# build -p and GOMAXPROCS, sized for a 2-core machine.
set -euo pipefail

NATS_VERSION=v2.15.2
TOXIPROXY_VERSION=v2.12.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
force=0
gotest=0
wanted=()
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        --go-test) gotest=1 ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        nats-server|clustercheck|toxiproxy) wanted+=("$arg") ;;
        *) echo "build.sh: unknown argument $arg (nats-server, clustercheck, toxiproxy, --force)" >&2; exit 2 ;;
    esac
done
[[ ${#wanted[@]} == 0 ]] && wanted=(nats-server clustercheck toxiproxy)

jobs="${BRAIN_CLUSTER_JOBS:-2}"
export GOMAXPROCS="$jobs"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED=0

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }

# with_lock <cache dir> <command...>: run the command holding <cache>/.lock, so
# two concurrent runs build once (the second waits, then finds it cached).
with_lock() {
    local dir="$1"; shift
    mkdir -p "$dir"
    if command -v flock >/dev/null 2>&1; then
        (
            flock 9
            "$@"
        ) 9>"$dir/.lock"
    else
        "$@"
    fi
}

# go_install <name> <cache dir> <versioned dir> <package@version> <built binary name>:
# go install a released module into <cache>/<versioned dir>/<name>, unless it
# is there. go install module@version builds with the module's own
# go.mod/go.sum (the official build), verified against the checksum database.
go_install() {
    local name="$1" cache="$2" dir="$3" pkg="$4" built="$5"
    local out="$cache/$dir"
    local target="$out/$name"
    if [[ $force == 0 && -x "$target" ]]; then
        printf '%-12s cached %6.1f s %s\n' "$name" 0 "$target"
        return
    fi
    echo "build.sh: building $pkg (go install -p $jobs)" >&2
    local t0 stage
    t0=$(date +%s.%N)
    stage="$(mktemp -d "$cache/stage.XXXXXX")"
    if ! env GOCACHE="${GOCACHE:-$cache/go-build}" GOMODCACHE="${GOMODCACHE:-$cache/gomod}" \
            GOFLAGS="-modcacherw" GOBIN="$stage" \
            go install -p "$jobs" -trimpath -ldflags "-s -w" "$pkg" >&2; then
        rm -rf "$stage"
        echo "build.sh: $name build failed" >&2
        return 1
    fi
    "$stage/$built" --version >&2
    mkdir -p "$out"
    mv -f "$stage/$built" "$target"
    rm -rf "$stage"
    printf '%-12s built  %6.1f s %s\n' "$name" "$(elapsed "$t0")" "$target"
}

build_nats() {
    go_install nats-server "${BRAIN_NATS_CACHE:-$repo/.cache/nats}" "nats-server-$NATS_VERSION" \
        "github.com/nats-io/nats-server/v2@$NATS_VERSION" nats-server
}

build_toxiproxy() {
    go_install toxiproxy "$cc_cache" "toxiproxy-$TOXIPROXY_VERSION" \
        "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION" server
}

# The Go environment clustercheck builds and tests with. -mod=mod lets go fill
# go.sum if an entry is missing; -buildvcs=false because the module lives
# inside brain's git tree.
cc_cache="${BRAIN_CLUSTER_CACHE:-$repo/.cache/cluster}"
cc_env=(GOCACHE="${GOCACHE:-$cc_cache/go-build}" GOMODCACHE="${GOMODCACHE:-$cc_cache/gomod}"
        GOFLAGS="-mod=mod -buildvcs=false -modcacherw")

test_clustercheck() {
    echo "build.sh: go test in tests/cluster/go" >&2
    (cd "$here/go" && env "${cc_env[@]}" go test -p "$jobs" -count=1 . >&2)
}

local_modules() {  # local_modules <module dir>: the directories its go.mod's replace directives name
    awk '$1 == "replace" && $3 == "=>" && $4 ~ /^[.][.]?[/]/ {print $4}' "$1/go.mod" |
        while read -r rel; do (cd "$1/$rel" && pwd); done
}

build_clustercheck() {
    local cache="$cc_cache"
    local src="$here/go"
    local target="$cache/bin/clustercheck"
    local stamp
    local -a shared
    mapfile -t shared < <(local_modules "$src")
    stamp="$({ cat "$here/build.sh"; go version; find "$src" "${shared[@]}" -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort | xargs cat; } | sha256sum | cut -d' ' -f1)"
    if [[ $force == 0 && -x "$target" && -f "$cache/stamp" && "$(cat "$cache/stamp")" == "$stamp" ]]; then
        printf '%-12s cached %6.1f s %s\n' clustercheck 0 "$target"
        return
    fi
    echo "build.sh: building clustercheck (go build -p $jobs in tests/cluster/go)" >&2
    local t0 stage
    t0=$(date +%s.%N)
    stage="$(mktemp -d "$cache/stage.XXXXXX")"
    if ! (cd "$src" && env "${cc_env[@]}" go build -p "$jobs" -trimpath -ldflags "-s -w" -o "$stage/clustercheck" . >&2); then
        rm -rf "$stage"
        echo "build.sh: clustercheck build failed" >&2
        return 1
    fi
    mkdir -p "$cache/bin"
    mv -f "$stage/clustercheck" "$target"
    echo "$stamp" > "$stage/stamp"
    mv -f "$stage/stamp" "$cache/stamp"
    rm -rf "$stage"
    printf '%-12s built  %6.1f s %s\n' clustercheck "$(elapsed "$t0")" "$target"
}

for w in "${wanted[@]}"; do
    case "$w" in
        nats-server) with_lock "${BRAIN_NATS_CACHE:-$repo/.cache/nats}" build_nats ;;
        clustercheck)
            with_lock "$cc_cache" build_clustercheck
            if [[ $gotest == 1 ]]; then test_clustercheck; fi
            ;;
        toxiproxy) with_lock "$cc_cache" build_toxiproxy ;;
    esac
done

