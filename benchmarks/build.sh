#!/usr/bin/env bash
# Build the benchmark harness's Go binaries into <repo>/.cache/bench/bin:
#
#   etcd-3.6     etcd server      go.etcd.io/etcd/server/v3      (benchmarks/go/etcd36)
#   etcdctl-3.6  etcdctl          go.etcd.io/etcd/etcdctl/v3     (benchmarks/go/etcd36)
#   benchmark    etcd's tool      go.etcd.io/etcd/v3/tools/benchmark (benchmarks/go/etcd36)
#   kine         kine, sqlite     github.com/k3s-io/kine, cgo    (benchmarks/go/kine)
#   brainload    our load tool    benchmarks/go/brainload
#   etcdutl-3.6  etcdutl          go.etcd.io/etcd/etcdutl/v3     (benchmarks/go/etcdutl36)
#   etcd-3.5, etcdctl-3.5, etcdutl-3.5                           (benchmarks/go/etcd35)
#   etcd-3.7, etcdctl-3.7, etcdutl-3.7                           (benchmarks/go/etcd37)
#
# (etcdutl and etcd 3.5 are for the migration tests: files real etcds wrote;
# etcd 3.7 is a benchmarked server, the third differential oracle and, with
# etcdutl 3.7, the migration tests' newest etcd.)
#
# The versions are pinned in the go.mod of each wrapper module (one place to
# change them); separate modules because kine needs etcd 3.7 and grpc/otel
# versions that would also move the 3.6 server.
#
# Idempotent: each group is rebuilt only when its inputs (go.mod, go.sum, its
# sources and those of the local modules its go.mod replaces, this script)
# changed or a binary is missing. Prints one line per
# binary on stdout, "<name> built|cached <seconds> s <path>", then the bin
# directory as the last line.
#
#   benchmarks/build.sh                    build what is missing or stale
#   benchmarks/build.sh --force            rebuild everything
#   benchmarks/build.sh [--force] NAME...  only these binaries' groups
#
# Environment: BRAIN_BENCH_CACHE overrides <repo>/.cache/bench; the Go build
# and module caches live under it (go-build/, gomod/) unless GOCACHE or
# GOMODCACHE are set; BRAIN_BENCH_JOBS (default 2) is the go build -p and
# GOMAXPROCS, sized for a 2-core machine.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
force=0
wanted=()
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
        -*) echo "build.sh: unknown option $arg" >&2; exit 2 ;;
        *) wanted+=("$arg") ;;
    esac
done

modver() {  # modver <wrapper dir> <module path>: the version its go.mod pins
    awk -v m="$2" '$1 == m && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$here/go/$1/go.mod"
}
etcd_version="$(modver etcd36 go.etcd.io/etcd/server/v3)"
etcdctl_version="$(modver etcd36 go.etcd.io/etcd/etcdctl/v3)"
bench_version="$(modver etcd36 go.etcd.io/etcd/v3)"
kine_version="$(modver kine github.com/k3s-io/kine)"
client_version="$(modver brainload go.etcd.io/etcd/client/v3)"
etcdutl_version="$(modver etcdutl36 go.etcd.io/etcd/etcdutl/v3)"
etcd35_version="$(modver etcd35 go.etcd.io/etcd/server/v3)"
etcd37_version="$(modver etcd37 go.etcd.io/etcd/server/v3)"
for v in etcd_version etcdctl_version bench_version kine_version client_version etcdutl_version etcd35_version \
         etcd37_version; do
    if [[ -z "${!v}" ]]; then
        echo "build.sh: cannot read $v from the wrapper go.mod files" >&2
        exit 2
    fi
done

cache="${BRAIN_BENCH_CACHE:-$repo/.cache/bench}"
bin="$cache/bin"
stamps="$cache/stamps"
mkdir -p "$bin" "$stamps"
staged=()  # this run's staging dirs, removed however the script ends
trap 'rm -rf "${staged[@]}"' EXIT

jobs="${BRAIN_BENCH_JOBS:-2}"
export GOMAXPROCS="$jobs"
export GOCACHE="${GOCACHE:-$cache/go-build}"
export GOMODCACHE="${GOMODCACHE:-$cache/gomod}"
# -mod=mod lets go fill go.sum if an entry is missing; -buildvcs=false because
# the modules live inside brain's git tree; -modcacherw so rm -rf .cache works.
export GOFLAGS="-mod=mod -buildvcs=false -modcacherw"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

# group -> binaries and the packages they come from (same order).
group_bins_etcd36=(etcd-3.6 etcdctl-3.6 benchmark)
group_pkgs_etcd36=(go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/v3/tools/benchmark)
group_bins_kine=(kine)
group_pkgs_kine=(github.com/k3s-io/kine)
group_bins_brainload=(brainload)
group_pkgs_brainload=(brain.bench/brainload)
group_bins_etcdutl36=(etcdutl-3.6)
group_pkgs_etcdutl36=(go.etcd.io/etcd/etcdutl/v3)
group_bins_etcd35=(etcd-3.5 etcdctl-3.5 etcdutl-3.5)
group_pkgs_etcd35=(go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/etcdutl/v3)
group_bins_etcd37=(etcd-3.7 etcdctl-3.7 etcdutl-3.7)
group_pkgs_etcd37=(go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/etcdutl/v3)
groups=(etcd36 kine brainload etcdutl36 etcd35 etcd37)

local_modules() {  # local_modules <module dir>: the directories its go.mod's replace directives name
    awk '$1 == "replace" && $3 == "=>" && $4 ~ /^[.][.]?[/]/ {print $4}' "$1/go.mod" |
        while read -r rel; do (cd "$1/$rel" && pwd); done
}

stamp_of() {  # inputs of one group: its recipe (not this script's prose), Go, its module's files and theirs it replaces
    # Worktrees sharing BRAIN_BENCH_CACHE agree on a stamp unless the build itself differs.
    local -a dirs
    mapfile -t dirs < <(local_modules "$here/go/$1")
    { declare -f build_group; declare -p "group_bins_$1" "group_pkgs_$1"; go version
      find "$here/go/$1" "${dirs[@]}" -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort | xargs cat
    } | sha256sum | cut -d' ' -f1
}

build_group() {  # build_group <group>: go build all its packages into a staging dir
    # The staging dir is private to this build (several builds may share the
    # cache at once); each binary is renamed into bin/ whole, so a reader sees
    # either the old binary or the new one, never a partial file.
    local g="$1" stage
    stage="$(mktemp -d "$cache/stage-$1.XXXXXX")"
    staged+=("$stage")
    local -n pkgs="group_pkgs_$g" bnames="group_bins_$g"
    local -a env=(CGO_ENABLED=0) flags=(-trimpath -ldflags "-s -w")
    if [[ $g == kine ]]; then
        # kine's own scripts/build: cgo with mattn/go-sqlite3, these tags and
        # CGO_CFLAGS (without the "nats" tag, which only embeds a NATS server,
        # and without -extldflags -static).
        env=(CGO_ENABLED=1 "CGO_CFLAGS=-O2 -DSQLITE_DEFAULT_MEMSTATUS=0 -DSQLITE_DISABLE_INTRINSIC
            -DSQLITE_ENABLE_COLUMN_METADATA -DSQLITE_ENABLE_DBPAGE_VTAB -DSQLITE_ENABLE_DBSTAT_VTAB
            -DSQLITE_ENABLE_MATH_FUNCTIONS -DSQLITE_ENABLE_MEMORY_MANAGEMENT -DSQLITE_ENABLE_OFFSET_SQL_FUNC
            -DSQLITE_ENABLE_PREUPDATE_HOOK -DSQLITE_ENABLE_RBU -DSQLITE_ENABLE_RTREE -DSQLITE_ENABLE_SESSION
            -DSQLITE_ENABLE_SNAPSHOT -DSQLITE_ENABLE_STAT4 -DSQLITE_ENABLE_UNLOCK_NOTIFY
            -DSQLITE_LIKE_DOESNT_MATCH_BLOBS -DSQLITE_THREADSAFE=1 -DSQLITE_WITHOUT_ZONEMALLOC")
        flags=(-trimpath
            -tags "sqlite_unlock_notify,sqlite_vtable,sqlite_stat4,sqlite_preupdate_hook,sqlite_math_functions,sqlite_dbstat,sqlite_column_metadata"
            -ldflags "-s -w -X github.com/k3s-io/kine/pkg/version.Version=$kine_version")
    fi
    local i
    for i in "${!pkgs[@]}"; do
        mkdir -p "$stage/$i"
    done
    (
        cd "$here/go/$g"
        # One go build per binary would redo the link-time work serially; one
        # invocation per group with -p builds shared packages once. go build
        # names binaries after the package, so stage each into its own dir.
        if [[ ${#pkgs[@]} == 1 ]]; then
            env "${env[@]}" go build -p "$jobs" "${flags[@]}" -o "$stage/0/${bnames[0]}" "${pkgs[0]}"
        else
            # Several main packages with -o <dir>/: names are the package's
            # (server/v3 -> server, etcdctl/v3 -> etcdctl, benchmark).
            env "${env[@]}" go build -p "$jobs" "${flags[@]}" -o "$stage/all/" "${pkgs[@]}"
        fi
    )
    if [[ ${#pkgs[@]} != 1 ]]; then
        for i in "${!pkgs[@]}"; do
            local p="${pkgs[$i]}" base
            base="${p##*/}"
            [[ $base =~ ^v[0-9]+$ ]] && { base="${p%/*}"; base="${base##*/}"; }
            mv "$stage/all/$base" "$stage/$i/${bnames[$i]}"
        done
    fi
    for i in "${!pkgs[@]}"; do
        mv -f "$stage/$i/${bnames[$i]}" "$bin/${bnames[$i]}"
    done
    rm -rf "$stage"
}

write_stamp() {  # write_stamp <group> <stamp>: atomically, like the binaries
    local tmp
    tmp="$(mktemp "$stamps/.$1.XXXXXX")"
    echo "$2" > "$tmp"
    mv -f "$tmp" "$stamps/$1"
}

want_group() {
    local g="$1" n
    [[ ${#wanted[@]} == 0 ]] && return 0
    local -n wnames="group_bins_$g"
    for n in "${wnames[@]}"; do
        for w in "${wanted[@]}"; do [[ $w == "$n" || $w == "$g" ]] && return 0; done
    done
    return 1
}

for g in "${groups[@]}"; do
    want_group "$g" || continue
    declare -n names="group_bins_$g"
    stamp="$(stamp_of "$g")"
    complete=1
    for n in "${names[@]}"; do [[ -x "$bin/$n" ]] || complete=0; done
    if [[ $force == 0 && $complete == 1 && -f "$stamps/$g" && "$(cat "$stamps/$g")" == "$stamp" ]]; then
        for n in "${names[@]}"; do printf '%-12s cached %6.1f s %s\n' "$n" 0 "$bin/$n"; done
        unset -n names
        continue
    fi
    rm -f "$stamps/$g"
    echo "build.sh: building ${names[*]} (go build -p $jobs in benchmarks/go/$g)" >&2
    t0=$(date +%s.%N)
    build_group "$g"
    t1=$(date +%s.%N)
    write_stamp "$g" "$stamp"
    for n in "${names[@]}"; do
        printf '%-12s built  %6.1f s %s\n' "$n" "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" "$bin/$n"
    done
    unset -n names
done
echo "build.sh: etcd $etcd_version, etcdctl $etcdctl_version, benchmark $bench_version, kine $kine_version, brainload on client $client_version, etcdutl $etcdutl_version, etcd $etcd35_version, etcd $etcd37_version" >&2
echo "$bin"
