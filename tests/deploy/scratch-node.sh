#!/usr/bin/env bash
# Runs the deploy files as docs/kubernetes.md says, on a scratch "node": an
# overlay of this machine's root filesystem whose writes land in a tmpfs, in
# a mount namespace of its own (run it under `unshare --mount`), so nothing
# reaches the real /etc, /opt or /var.
#
#   scratch-node.sh systemd    SCRATCH WHEEL   # install user pki systemd, then boot the root with
#                                              # systemd (systemd-nspawn) and check the unit serves
#   scratch-node.sh static-pod SCRATCH WHEEL   # install user pki static-pod, then run the pod's
#                                              # container command the way the kubelet would
#
# Prints "check NAME VALUE" lines for tests/deploy/test_deploy_files.py to
# assert on; exits non-zero, with the logs, when a step fails.
set -euo pipefail

MODE="$1" SCRATCH="$2" WHEEL="$3"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ROOT="$SCRATCH/root"

check() { echo "check $1 $2"; }

make_root() {
    mount --make-rprivate /
    mount -t tmpfs -o mode=0755 scratch "$SCRATCH"
    mkdir -p "$SCRATCH/upper" "$SCRATCH/work" "$ROOT"
    mount -t overlay overlay -o "lowerdir=/,upperdir=$SCRATCH/upper,workdir=$SCRATCH/work" "$ROOT"
    # The checkout as an operator has it: deploy/ and docs/ (the script's
    # install step copies docs/kubernetes.md), and the wheel to install.
    mkdir -p "$ROOT/src/brain" "$ROOT/src/wheels"
    cp -r "$REPO/deploy" "$REPO/docs" "$ROOT/src/brain/"
    cp "$WHEEL" "$ROOT/src/wheels/"
    # A node does not have this machine's services or its leftovers.
    rm -rf "$ROOT/opt/brain" "$ROOT/var/lib/brain" "$ROOT/etc/brain" "$ROOT/etc/kubernetes" \
        "$ROOT/etc/systemd/system/brain.service" "$ROOT/usr/share/doc/brain" "$ROOT/root/brain-ca.key"
    if grep -q '^brain:' "$ROOT/etc/passwd"; then chroot "$ROOT" userdel brain; fi
    if grep -q '^brain:' "$ROOT/etc/group"; then chroot "$ROOT" groupdel brain; fi
}

# in_root CMD...: CMD in the scratch root, with a login-like environment
# (Debian's PATH, so python3 is Debian's) plus this machine's pip settings.
in_root() {
    local env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8)
    local v
    for v in $(compgen -e); do
        case "$v" in PIP_*|http_proxy|https_proxy|no_proxy|HTTP_PROXY|HTTPS_PROXY|NO_PROXY|SSL_CERT_FILE|REQUESTS_CA_BUNDLE)
            env+=("$v=${!v}") ;;
        esac
    done
    chroot "$ROOT" /usr/bin/env -i "${env[@]}" "$@"
}

setup_node() {  # the docs' steps, for the systemd or the static-pod way
    mount -t proc proc "$ROOT/proc"
    mount --rbind /dev "$ROOT/dev"
    local wheel
    wheel="/src/wheels/$(basename "$WHEEL")"
    in_root /src/brain/deploy/brain-node.sh install "$wheel" user pki "$1"
    umount -R "$ROOT/dev"
    umount "$ROOT/proc"
}

# ---------------------------------------------------------------- systemd ---

container_pid() {  # the container's init: a descendant of nspawn named systemd
    local parent=$1 child
    for child in $(cat /proc/"$parent"/task/*/children 2>/dev/null); do
        if [ "$(cat /proc/"$child"/comm 2>/dev/null)" = systemd ]; then echo "$child"; return 0; fi
        container_pid "$child" && return 0
    done
    return 1
}

run_systemd() {
    setup_node systemd
    # Units this machine enables that a fresh node would not run (its own
    # etcd on 2379, a database): masked in the scratch root only.
    local unit
    for unit in $(chroot "$ROOT" systemctl list-unit-files --state=enabled --type=service --no-legend |
                  awk '{print $1}'); do
        case "$unit" in brain.service|getty@.service|systemd-*) ;; *) chroot "$ROOT" systemctl mask -q "$unit" ;; esac
    done
    check enabled "$(chroot "$ROOT" systemctl is-enabled brain.service)"
    # Its own machine id, so the container's journal is its own.
    rm -f "$ROOT/etc/machine-id"; chroot "$ROOT" systemd-machine-id-setup >/dev/null 2>&1
    systemd-nspawn -D "$ROOT" --register=no --keep-unit --link-journal=no --private-network \
        --console=pipe -b >"$SCRATCH/console.log" 2>&1 &
    local nspawn=$!
    local cpid="" i
    for i in $(seq 100); do cpid="$(container_pid $nspawn || true)"; [ -n "$cpid" ] && break; sleep 0.2; done
    [ -n "$cpid" ] || { cat "$SCRATCH/console.log"; echo "no container init found" >&2; exit 1; }
    ns() { nsenter -t "$cpid" -m -u -i -n -p -- "$@"; }
    # Boot finished (or failed) and brain's unit settled.
    for i in $(seq 120); do
        state="$(ns systemctl is-system-running 2>/dev/null || true)"
        case "$state" in running|degraded) break ;; esac
        sleep 0.5
    done
    check system "$state"
    etcdctl_tls() {
        ns env ETCDCTL_API=3 etcdctl --endpoints https://127.0.0.1:2379 --cacert /etc/brain/pki/ca.crt \
            --cert /etc/kubernetes/pki/apiserver-brain-client.crt \
            --key /etc/kubernetes/pki/apiserver-brain-client.key --dial-timeout=5s --command-timeout=10s "$@"
    }
    readyz() {
        ns python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:2381/readyz", timeout=5).read().decode())' 2>/dev/null || true
    }
    local ready=""
    for i in $(seq 60); do ready="$(readyz)"; [ "$ready" = ok ] && break; sleep 0.5; done
    check active "$(ns systemctl is-active brain.service || true)"
    check readyz "$ready"
    local pid
    pid="$(ns systemctl show -P MainPID brain.service)"
    check main-uid "$(ns awk '/^Uid:/ {print $2}' /proc/"$pid"/status)"
    check main-user "$(ns systemctl show -P User brain.service)"
    check command "$(ns cat /proc/"$pid"/cmdline | tr '\0' ' ' | awk '{print $2, $3}')"
    check documentation "$(ns systemctl show -P Documentation brain.service)"
    check doc-file "$(ns test -s /usr/share/doc/brain/kubernetes.md && echo present || echo missing)"
    check verify "$(ns systemd-analyze verify /etc/systemd/system/brain.service 2>&1 | grep -c 'brain.service' || true)"
    check put "$(etcdctl_tls put /registry/deploy-test yes 2>&1)"
    check version "$(etcdctl_tls endpoint status -w json 2>&1 | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["version"])' 2>&1)"
    check unix-get "$(ns env ETCDCTL_API=3 etcdctl --endpoints unix:///run/brain/brain.sock get /registry/deploy-test --print-value-only 2>&1)"
    check socket-dir "$(ns stat -c '%U:%G %a' /run/brain)"
    check data-dir "$(ns stat -c '%U:%G %a' /var/lib/brain/data)"
    ns systemctl stop brain.service
    check stop-status "$(ns systemctl show -P ExecMainStatus brain.service) $(ns systemctl show -P Result brain.service)"
    ns systemctl start brain.service
    local got=""
    for i in $(seq 60); do got="$(etcdctl_tls get /registry/deploy-test --print-value-only 2>/dev/null || true)"; [ "$got" = yes ] && break; sleep 0.5; done
    check after-restart "$got"
    if [ "$got" != yes ] || [ "$ready" != ok ]; then
        ns journalctl -u brain.service --no-pager -n 50 >&2 || true
    fi
    kill -TERM "$nspawn"
    for i in $(seq 120); do kill -0 "$nspawn" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$nspawn" 2>/dev/null; then kill -KILL "$nspawn"; fi
    wait "$nspawn" || true
    check halted yes
}

# ------------------------------------------------------------- static pod ---

# pod_spec: the manifest's fields this needs, as shell assignments.
pod_spec() {
    /usr/bin/python3 - "$ROOT/etc/kubernetes/manifests/brain.yaml" <<'EOF'
import shlex, sys, yaml
pod = yaml.safe_load(open(sys.argv[1]))
spec = pod["spec"]
c = spec["containers"][0]
sc = spec.get("securityContext", {})
vols = {v["name"]: v["hostPath"] for v in spec["volumes"]}
print("RUN_UID=%d RUN_GID=%d" % (sc["runAsUser"], sc["runAsGroup"]))
print("COMMAND=(%s)" % " ".join(shlex.quote(a) for a in c["command"]))
print("ENVNAMES=(%s)" % " ".join(e["name"] for e in c.get("env", [])))
print("MOUNTS=(%s)" % " ".join(shlex.quote("%s:%s:%s:%s" % (vols[m["name"]]["path"], vols[m["name"]].get("type", ""),
                                                            m["mountPath"], "ro" if m.get("readOnly") else "rw"))
                                for m in c["volumeMounts"]))
probe = c["startupProbe"]["httpGet"]
print("PROBE=%s" % shlex.quote("http://%s:%d%s" % (probe["host"], probe["port"], probe["path"])))
print("DROP_ALL=%d NO_NEW_PRIVS=%d" % ("ALL" in c.get("securityContext", {}).get("capabilities", {}).get("drop", []),
                                        c.get("securityContext", {}).get("allowPrivilegeEscalation") is False))
EOF
}

# run_pod NAME: the container command as the kubelet and runtime would run it:
# hostPath volumes checked for their type and bind-mounted (read-only where
# the mount says so), the pod's uid/gid with no supplementary groups, no
# capabilities, no_new_privs, $(NODE_NAME) expanded, in a network namespace
# that stands for the node's (hostNetwork). The "image" is the node's root
# with brain's venv first on PATH (the Dockerfile's pip install puts brain
# on the image's PATH the same way).
run_pod() {
    local name=$1 m host type target mode
    local ctr="$SCRATCH/ctr-$name"
    mkdir -p "$ctr"
    mount --bind "$ROOT" "$ctr"
    for m in "${MOUNTS[@]}"; do
        IFS=: read -r host type target mode <<<"$m"
        if [ "$type" = Directory ] && [ ! -d "$ROOT$host" ]; then
            umount "$ctr"; echo "hostPath type check failed: $host is not a directory"; return 0
        fi
        mkdir -p "$ROOT$host"
        mount --bind "$ROOT$host" "$ctr$target"
        [ "$mode" = ro ] && mount -o remount,bind,ro "$ctr$target"
    done
    mount -t proc proc "$ctr/proc"
    mount --rbind /dev "$ctr/dev"
    local cmd=() arg
    for arg in "${COMMAND[@]}"; do cmd+=("${arg//\$(NODE_NAME)/scratch-node}"); done
    local caps=()
    [ "$DROP_ALL" = 1 ] && caps=(--inh-caps=-all --bounding-set=-all)
    [ "$NO_NEW_PRIVS" = 1 ] && caps+=(--no-new-privs)
    unshare --net -- bash -c '
        ip link set lo up
        ctr=$1; shift
        exec chroot "$ctr" /usr/bin/setpriv --reuid "$RUN_UID" --regid "$RUN_GID" --clear-groups "${@}"
    ' _ "$ctr" "${caps[@]}" -- /usr/bin/env -i PATH=/opt/brain/bin:/usr/local/bin:/usr/bin:/bin \
        NODE_NAME=scratch-node "${cmd[@]}" >"$SCRATCH/pod-$name.log" 2>&1 &
    POD_PID=$!
    POD_CTR=$ctr
}

pod_end() {  # wait for the pod's process, then take its mounts down
    local rc=0
    wait "$POD_PID" || rc=$?
    umount -R "$POD_CTR"
    return $rc
}

pod_wait_ready() {  # the startup probe, from inside the pod's network namespace
    local i out
    for i in $(seq 120); do
        kill -0 "$POD_PID" 2>/dev/null || return 1
        out="$(nsenter -t "$POD_PID" -n -- \
            python3 -c "import urllib.request as u; print(u.urlopen('$PROBE', timeout=5).read().decode())" 2>/dev/null || true)"
        [ "$out" = ok ] && return 0
        sleep 0.5
    done
    return 1
}

run_static_pod() {
    setup_node static-pod
    check manifest "$(test -s "$ROOT/etc/kubernetes/manifests/brain.yaml" && echo present || echo missing)"
    export RUN_UID RUN_GID DROP_ALL NO_NEW_PRIVS
    eval "$(pod_spec)"
    check pod-user "$RUN_UID:$RUN_GID"
    check data-owner "$(stat -c '%u:%g %a' "$ROOT/var/lib/brain")"
    check key-owner "$(stat -c '%u:%g %a' "$ROOT/etc/brain/pki/server.key")"
    run_pod ok
    if pod_wait_ready; then check ready yes; else check ready no; fi
    local brain_pid=$POD_PID  # unshare, chroot, setpriv and env exec one another: this is brain
    check brain-uid "$(awk '/^Uid:/ {print $2}' /proc/"$brain_pid"/status 2>/dev/null)"
    check brain-caps "$(awk '/^CapEff:/ {print $2}' /proc/"$brain_pid"/status 2>/dev/null)"
    check put "$(nsenter -t "$brain_pid" -n -- env ETCDCTL_API=3 etcdctl --endpoints https://127.0.0.1:2379 \
        --cacert "$ROOT/etc/brain/pki/ca.crt" --cert "$ROOT/etc/kubernetes/pki/apiserver-brain-client.crt" \
        --key "$ROOT/etc/kubernetes/pki/apiserver-brain-client.key" --dial-timeout=5s put /registry/pod-test yes 2>&1)"
    kill -TERM "$brain_pid" 2>/dev/null || true
    local rc=0
    pod_end || rc=$?
    check exit "$rc"
    check data-files "$(find "$ROOT/var/lib/brain/data" -newer "$ROOT/etc/kubernetes/manifests/brain.yaml" ! -user 65532 | wc -l) not-owned $(find "$ROOT/var/lib/brain/data" -type f | wc -l) files"
    [ "$rc" = 0 ] || cat "$SCRATCH/pod-ok.log" >&2

    # The node as it was before: the kubelet's DirectoryOrCreate data dir
    # (root's, 0755) and a root-owned key. brain must name the cause.
    rm -rf "$ROOT/var/lib/brain"; install -d -m 0755 "$ROOT/var/lib/brain"
    run_pod root-data-dir; pod_end || true
    check root-data-dir "$(tail -1 "$SCRATCH/pod-root-data-dir.log")"
    chown 65532:65532 "$ROOT/var/lib/brain"; chown 0:0 "$ROOT/etc/brain/pki/server.key"
    run_pod root-key; pod_end || true
    check root-key "$(tail -1 "$SCRATCH/pod-root-key.log")"
    rm -rf "$ROOT/var/lib/brain"
    check unprepared "$(run_pod unprepared)"
}

make_root
case "$MODE" in
    systemd) run_systemd ;;
    static-pod) run_static_pod ;;
    *) echo "unknown mode $MODE" >&2; exit 2 ;;
esac
