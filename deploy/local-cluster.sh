#!/usr/bin/env bash
# A 3-replica brain cluster on this machine, to try it out: three
# nats-servers (a JetStream cluster, the replicated journal) and three
# `brain serve --journal-url` replicas, all on loopback.
#
#   deploy/local-cluster.sh     start everything, print the endpoints, watch;
#                               Ctrl-C (or SIGTERM) stops it all
#
# It stays in the foreground and watches its six processes.  One that dies
# is reported and the others go on serving: kill -9 the leader (its pid is
# printed) and the two others elect a new one in about two seconds.  After
# RESTART_DELAY seconds the script starts it again; a replica recovers from
# its data directory and catches up from the journal.
#
# Environment (every port list has three ports; given ports must be free):
#   DIR=/tmp/bc                     data and logs (default ./cluster.brain)
#   CLIENT_PORTS=2379,12379,22379   the replicas' client ports  \  default: these
#   METRICS_PORTS=2381,12381,22381  their metrics ports          | when they are
#   NATS_PORTS=4222,4223,4224       the nats-servers' clients    | free, else
#   ROUTE_PORTS=6222,6223,6224      their cluster routes        /  free ports
#   PORTS=free                      free ports for everything not given
#   RESTART_DELAY=5                 seconds before a dead process is started
#                                   again; -1 leaves it down (the script
#                                   prints the command that restarts it)
#   PYTHON=...                      the Python brain is installed in (default:
#                                   the checkout's .venv, else python3)
#   NATS_SERVER=/path/nats-server   default: built by tests/cluster/build.sh
#                                   (from its Go module once, then cached)
#
# "up" is printed once every replica lists all three members with their
# client URLs and knows the leader (right after start the replicas take a
# few seconds to agree on the member list).  Data survives a restart of the
# script (the replicas recover from their checkpoints and the stream);
# delete $DIR to start afresh.  The nats-servers fsync before they
# acknowledge (sync_interval: always), as durable as a single brain.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$(realpath -m "${DIR:-cluster.brain}")"
python="${PYTHON:-}"
if [[ -z $python ]]; then
    if [[ -x $repo/.venv/bin/python ]]; then python="$repo/.venv/bin/python"; else python=python3; fi
elif [[ $python == */* ]]; then
    python="$(realpath -ms "$python")"  # -s: a venv's python is a symlink, and must stay the venv's
fi
restart_delay="${RESTART_DELAY:-5}"
[[ $restart_delay =~ ^-?[0-9]+$ ]] || { echo "RESTART_DELAY must be a number of seconds, got '$restart_delay'" >&2; exit 2; }
if ! (cd "$repo" && "$python" -c 'import brain._transport, grpc, nats') 2>/dev/null; then
    echo "brain is not installed for $python: run 'make serve' once (it makes ./.venv), or set PYTHON" >&2
    exit 2
fi
nats="${NATS_SERVER:-}"
if [[ -z "$nats" ]]; then
    nats="$(bash "$repo/tests/cluster/build.sh" nats-server | awk '{print $NF}')"
fi
mkdir -p "$dir"

# --- ports --------------------------------------------------------------------
# Each group: the ports given, else the defaults when every one is free,
# else free ports from the kernel (held together, so no two are the same).
ports="$(cd "$repo" && "$python" - "${PORTS:-}" \
    "CLIENT_PORTS=${CLIENT_PORTS:-}=2379,12379,22379" "METRICS_PORTS=${METRICS_PORTS:-}=2381,12381,22381" \
    "NATS_PORTS=${NATS_PORTS:-}=4222,4223,4224" "ROUTE_PORTS=${ROUTE_PORTS:-}=6222,6223,6224" <<'EOF'
import socket, sys

held = []

def take(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    held.append(s)
    return s.getsockname()[1]

free_only = sys.argv[1] == "free"
for spec in sys.argv[2:]:
    name, given, default = spec.split("=")
    if given:
        try:
            wanted = [int(p) for p in given.split(",")]
        except ValueError:
            sys.exit(f"{name}={given}: three port numbers, comma-separated")
        if len(wanted) != 3:
            sys.exit(f"{name}={given}: three ports, one per server")
        for p in wanted:
            if take(p) is None:
                sys.exit(f"{name}: 127.0.0.1:{p} is taken")
        print(f"{name} {given}")
        continue
    chosen = None if free_only else [take(int(p)) for p in default.split(",")]
    if chosen is None or None in chosen:
        if chosen is not None:
            print(f"note: {name} {default} are not all free: free ports instead", file=sys.stderr)
        chosen = [take(0) for _ in range(3)]
    print(f"{name} {','.join(map(str, chosen))}")
EOF
)" || exit 2
while read -r name list; do
    IFS=, read -r -a "${name,,}" <<<"$list"
done <<<"$ports"
# shellcheck disable=SC2154  # set by the loop above
endpoints="127.0.0.1:${client_ports[0]},127.0.0.1:${client_ports[1]},127.0.0.1:${client_ports[2]}"
nats_urls="127.0.0.1:${nats_ports[0]},127.0.0.1:${nats_ports[1]},127.0.0.1:${nats_ports[2]}"
routes="nats-route://127.0.0.1:${route_ports[0]},nats-route://127.0.0.1:${route_ports[1]},nats-route://127.0.0.1:${route_ports[2]}"

# --- the six processes ----------------------------------------------------------
declare -A pid_of=() watcher_of=() name_of=() started=() command_of=()
helper=""   # the pid of the readiness check while it runs
nap=""      # the pid of the sleep before a restart (a trap runs during `wait`, not during `sleep`)

# Each server runs under a watcher, a subshell that waits for it and exits
# with its status (bash prints its own "Killed" line, with the whole
# command, for a job killed by a signal; the watcher's is silenced), and in
# a session of its own: Ctrl-C reaches this script only, which stops the
# replicas before NATS.
run() {  # run NAME LOG COMMAND...: the server, its pid in $dir/NAME.pid
    local name=$1 log=$2
    shift 2
    rm -f "$dir/$name.pid"
    (
        cd "$repo"
        setsid "$@" >> "$log" 2>&1 &
        echo $! > "$dir/$name.pid"
        wait $!
    ) 2>/dev/null &
    watcher_of[$name]=$!
    name_of[$!]=$name
    command_of[$name]="cd $(printf %q "$repo") && setsid $(printf '%q ' "$@")>> $(printf %q "$log") 2>&1 &"
    while [[ ! -s $dir/$name.pid ]]; do sleep 0.02; done
    pid_of[$name]=$(< "$dir/$name.pid")
    started[$name]=$SECONDS
}

start() {  # start NAME: n0..n2 (nats-server) or b0..b2 (brain replica)
    local name=$1 i=${1:1}
    if [[ $name == n* ]]; then
        mkdir -p "$dir/$name"
        cat > "$dir/$name/nats.conf" <<EOF
server_name: $name
listen: 127.0.0.1:${nats_ports[$i]}
jetstream { store_dir: "$dir/$name/jetstream", sync_interval: always }
cluster { name: brain-local, listen: 127.0.0.1:${route_ports[$i]}, routes: [$routes] }
EOF
        run "$name" "$dir/$name/nats.log" "$nats" -c "$dir/$name/nats.conf"
    else
        local url="http://127.0.0.1:${client_ports[$i]}"
        run "$name" "$dir/$name.log" "$python" -m brain serve --name "$name" --data-dir "$dir/$name" \
            --listen-client-urls "$url" --advertise-client-urls "$url" \
            --listen-metrics-urls "http://127.0.0.1:${metrics_ports[$i]}" --journal-url "nats://$nats_urls/local"
    fi
}

log_of() { if [[ $1 == n* ]]; then echo "$dir/$1/nats.log"; else echo "$dir/$1.log"; fi; }

describe() {  # describe NAME: its addresses
    local i=${1:1}
    if [[ $1 == n* ]]; then
        echo "nats 127.0.0.1:${nats_ports[$i]}  routes 127.0.0.1:${route_ports[$i]}"
    else
        echo "client 127.0.0.1:${client_ports[$i]}  metrics 127.0.0.1:${metrics_ports[$i]}"
    fi
}

stop_all() {  # SIGTERM to the replicas (they flush to the journal), then to NATS
    local name group
    for group in b n; do
        local pids=() watchers=()
        for name in "${!pid_of[@]}"; do
            [[ $name == "$group"* ]] || continue
            pids+=("${pid_of[$name]}")
            watchers+=("${watcher_of[$name]}")
        done
        ((${#pids[@]})) || continue
        kill -TERM "${pids[@]}" 2>/dev/null || true
        wait "${watchers[@]}" 2>/dev/null || true
    done
    pid_of=()
    watcher_of=()
    name_of=()
}

stopped() {  # the trap of SIGINT and SIGTERM: the one way this script ends well
    trap - INT TERM
    [[ -n $helper ]] && kill "$helper" 2>/dev/null
    [[ -n $nap ]] && kill "$nap" 2>/dev/null
    echo
    echo "$1: stopping the replicas, then the nats-servers..."
    stop_all
    echo "stopped.  Data and logs stay in $dir: run the script again to go on, or delete it to start afresh."
    exit 0
}
trap 'stopped SIGINT' INT
trap 'stopped SIGTERM' TERM
# A failure of the script itself (not a signal) must not leave servers behind.
trap 'stop_all' EXIT

for name in n0 n1 n2; do start "$name"; done
sleep 1
for name in n0 n1 n2; do
    if ! kill -0 "${pid_of[$name]}" 2>/dev/null; then
        echo "nats-server $name did not start:" >&2
        tail -3 "$dir/$name/nats.log" >&2
        exit 1
    fi
done
for name in b0 b1 b2; do start "$name"; done

# --- up: every replica lists every member and knows the leader ---------------------
echo "waiting until every replica lists the three members and knows the leader (logs in $dir)..."
(cd "$repo" && exec "$python" - "$endpoints" <<'EOF'
import sys, time
import grpc
from brain.api.pb.etcdserverpb import rpc_pb2, rpc_pb2_grpc

endpoints = sys.argv[1].split(",")
deadline = time.monotonic() + 120
problem = "no answer yet"
while time.monotonic() < deadline:
    leaders, problem = set(), None
    for ep in endpoints:
        try:
            with grpc.insecure_channel(ep) as ch:
                members = rpc_pb2_grpc.ClusterStub(ch).MemberList(rpc_pb2.MemberListRequest(), timeout=2).members
                leader = rpc_pb2_grpc.MaintenanceStub(ch).Status(rpc_pb2.StatusRequest(), timeout=2).leader
        except grpc.RpcError as e:
            problem = f"{ep}: {e.code().name}"
            break
        urls = {u.split("://", 1)[-1] for m in members for u in m.clientURLs}
        names = {m.ID: m.name for m in members}
        if urls != set(endpoints) or leader not in names:
            problem = f"{ep} lists {sorted(urls) or 'no member'}" + ("" if leader in names else ", no leader")
            break
        leaders.add(names[leader])
    if problem is None and len(leaders) == 1:
        print(leaders.pop())
        sys.exit(0)
    time.sleep(0.5)
sys.exit(f"not up after 120 s: {problem}")
EOF
) > "$dir/.leader" &
helper=$!
if ! wait "$helper"; then
    helper=""
    for name in b0 b1 b2; do echo "--- $(log_of "$name") (end)" >&2; tail -5 "$(log_of "$name")" >&2; done
    exit 1
fi
helper=""
leader="$(cat "$dir/.leader")"
cat <<EOF
brain cluster up, leader $leader:
  b0  $(describe b0)  pid ${pid_of[b0]}
  b1  $(describe b1)  pid ${pid_of[b1]}
  b2  $(describe b2)  pid ${pid_of[b2]}
  n0  $(describe n0)  pid ${pid_of[n0]}
  n1  $(describe n1)  pid ${pid_of[n1]}
  n2  $(describe n2)  pid ${pid_of[n2]}
  logs  $dir/b0.log ... $dir/n0/nats.log ...
  try   ETCDCTL_API=3 etcdctl --endpoints $endpoints endpoint status --cluster -w table
  failover: kill -9 the leader's pid; the others elect a new leader in about two seconds
Ctrl-C stops the six processes.
EOF

# --- watch: report a death, keep the others serving, start it again ------------------
while :; do
    if ((${#name_of[@]} == 0)); then
        echo "every process is down; Ctrl-C quits"
        sleep infinity &
        nap=$!
        wait "$nap" || true
        continue
    fi
    watcher=""
    status=0
    wait -n -p watcher "${!name_of[@]}" || status=$?
    [[ -n $watcher && -n ${name_of[$watcher]:-} ]] || continue
    name=${name_of[$watcher]}
    dead=${pid_of[$name]}
    unset "name_of[$watcher]" "pid_of[$name]" "watcher_of[$name]"
    lived=$((SECONDS - started[$name]))
    if ((status > 128)); then how="was killed by SIG$(kill -l $((status - 128)))"; else how="exited with status $status"; fi
    echo "$(date +%T) $name ($(describe "$name"), pid $dead) $how after ${lived}s; the others go on serving."
    if ((restart_delay < 0)); then
        echo "  left down (RESTART_DELAY=$restart_delay); to start it again by hand (this script no longer watches it):"
        echo "    ${command_of[$name]}"
        continue
    fi
    if ((lived < 10 && status != 137)); then
        echo "  it died ${lived}s after it started: not restarting it; its log, $(log_of "$name"), ends:"
        tail -5 "$(log_of "$name")" | sed 's/^/    /'
        continue
    fi
    echo "  starting it again in ${restart_delay}s (RESTART_DELAY); it catches up from the journal"
    sleep "$restart_delay" &
    nap=$!
    wait "$nap" || true
    nap=""
    start "$name"
    echo "$(date +%T) $name started again, pid ${pid_of[$name]}"
done
