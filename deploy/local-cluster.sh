#!/usr/bin/env bash
# A 3-replica brain cluster on this machine, to try it out: three
# nats-servers (a JetStream cluster, the replicated journal) and three
# `brain serve --journal-url` replicas, all on loopback.
#
#   deploy/local-cluster.sh            start everything; Ctrl-C stops it all
#   DIR=/tmp/bc deploy/local-cluster.sh   keep data and logs elsewhere (default ./cluster.brain)
#
# Clients:  127.0.0.1:2379, 127.0.0.1:12379, 127.0.0.1:22379 (metrics: 2381, 12381, 22381)
#   etcdctl --endpoints 127.0.0.1:2379,127.0.0.1:12379,127.0.0.1:22379 endpoint status --cluster -w table
# NATS:     127.0.0.1:4222, 127.0.0.1:4223, 127.0.0.1:4224 (cluster routes on 6222, 6223, 6224)
# (all below the kernel's ephemeral port range, so no outgoing connection holds one)
#
# nats-server comes from tests/cluster/build.sh (built from its Go module
# once, then cached), or NATS_SERVER=/path/to/nats-server.  Data survives a
# restart of the script: the replicas recover from their checkpoints and
# the stream; delete $DIR to start afresh.  The NATS servers fsync before
# they acknowledge (sync_interval: always), as durable as a single brain.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$(realpath -m "${DIR:-cluster.brain}")"
python="${PYTHON:-python3}"
nats="${NATS_SERVER:-}"
if [[ -z "$nats" ]]; then
    nats="$(bash "$repo/tests/cluster/build.sh" nats-server | awk '{print $NF}')"
fi
mkdir -p "$dir"

pids=()
stop() {
    trap - INT TERM EXIT
    echo "stopping..."
    # the replicas first (they flush to the journal), NATS after them
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        kill -TERM "${pids[$i]}" 2>/dev/null || true
        if ((i == 3)); then wait "${pids[@]:3}" 2>/dev/null || true; fi
    done
    wait 2>/dev/null || true
}
trap stop INT TERM EXIT

routes="nats-route://127.0.0.1:6222,nats-route://127.0.0.1:6223,nats-route://127.0.0.1:6224"
for i in 0 1 2; do
    p=$i
    mkdir -p "$dir/nats$i"
    cat > "$dir/nats$i/nats.conf" <<EOF
server_name: n$i
listen: 127.0.0.1:$((4222 + p))
jetstream { store_dir: "$dir/nats$i/jetstream", sync_interval: always }
cluster { name: brain-local, listen: 127.0.0.1:$((6222 + p)), routes: [$routes] }
EOF
    "$nats" -c "$dir/nats$i/nats.conf" > "$dir/nats$i/nats.log" 2>&1 &
    pids+=($!)
done

journal="nats://127.0.0.1:4222,127.0.0.1:4223,127.0.0.1:4224/local"
for i in 0 1 2; do
    port=$(( 2379 + i * 10000 ))
    ( cd "$repo" && exec "$python" -m brain serve --name "b$i" --data-dir "$dir/b$i" \
        --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
        --listen-metrics-urls "http://127.0.0.1:$((port + 2))" --journal-url "$journal" ) > "$dir/b$i.log" 2>&1 &
    pids+=($!)
done

sleep 1
for i in 0 1 2; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
        echo "nats-server n$i did not start:" >&2
        tail -3 "$dir/nats$i/nats.log" >&2
        exit 1
    fi
done
echo "waiting for a leader (logs in $dir)..."
for _ in $(seq 120); do
    if grep -q "leading the journal" "$dir"/b?.log 2>/dev/null; then
        break
    fi
    sleep 0.5
done
grep -h "leading the journal" "$dir"/b?.log | tail -1 || { echo "no leader yet; see $dir/b*.log" >&2; }
cat <<EOF
brain cluster up:
  clients   127.0.0.1:2379  127.0.0.1:12379  127.0.0.1:22379
  metrics   127.0.0.1:2381  127.0.0.1:12381  127.0.0.1:22381
  try       ETCDCTL_API=3 etcdctl --endpoints 127.0.0.1:2379,127.0.0.1:12379,127.0.0.1:22379 endpoint status --cluster -w table
Ctrl-C stops the six processes.
EOF
wait -n "${pids[@]}" || true
echo "a process exited; see the logs in $dir" >&2
