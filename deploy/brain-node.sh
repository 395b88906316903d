#!/usr/bin/env bash
# Set up brain on a Kubernetes control-plane node: the steps of
# docs/kubernetes.md, in the order they must run. Run as root:
#
#   deploy/brain-node.sh install [SOURCE]  # venv in /opt/brain, brain in it, docs in /usr/share/doc/brain
#   deploy/brain-node.sh user              # the brain system user, uid/gid 65532 (the container image's)
#   deploy/brain-node.sh pki               # brain's CA, serving certificate, the apiserver's client certificate
#   deploy/brain-node.sh systemd           # run brain as deploy/brain.service ...
#   deploy/brain-node.sh static-pod        # ... or as deploy/brain-static-pod.yaml under the kubelet
#
# Several steps may be given at once, e.g. `install user pki systemd`.
# SOURCE is what pip installs: by default this script's checkout; a wheel
# or the distribution name brain-etcd also work.
#
# The paths below are the ones deploy/brain.service and
# deploy/brain-static-pod.yaml use; the environment can move the
# certificates (the Kubernetes end-to-end test writes them into its work
# directory with BRAIN_PKI_DIR, KUBE_PKI_DIR, BRAIN_CA_KEY and BRAIN_USER).
# Every setting: docs/kubernetes.md, "The script's settings".
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BRAIN_VENV="${BRAIN_VENV:-/opt/brain}"
BRAIN_USER="${BRAIN_USER:-brain}"
BRAIN_UID="${BRAIN_UID:-65532}"               # the image's user; the static pod's runAsUser
BRAIN_DATA="${BRAIN_DATA:-/var/lib/brain}"     # the unit's StateDirectory, the pod's hostPath
BRAIN_PKI_DIR="${BRAIN_PKI_DIR:-/etc/brain/pki}"
KUBE_PKI_DIR="${KUBE_PKI_DIR:-/etc/kubernetes/pki}"
BRAIN_CA_KEY="${BRAIN_CA_KEY:-/root/brain-ca.key}"  # kept off the serving path
BRAIN_SANS="${BRAIN_SANS:-IP:127.0.0.1,DNS:localhost}"
BRAIN_CERT_DAYS="${BRAIN_CERT_DAYS:-365}"

die() { echo "brain-node: $*" >&2; exit 1; }
say() { echo "brain-node: $*"; }

step_install() {
    local source="${1:-}"
    if [ -z "$source" ]; then
        if [ -f "$HERE/../pyproject.toml" ]; then source="$(cd "$HERE/.." && pwd)"; else source=brain-etcd; fi
    fi
    command -v python3 >/dev/null || die "python3 (3.11 or newer) is needed: apt-get install python3"
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "brain needs Python 3.11 or newer"
    python3 -c 'import ensurepip' 2>/dev/null || die "python3 -m venv needs ensurepip: apt-get install python3-venv"
    # A venv of its own: Debian's pip refuses system-wide installs (PEP 668).
    python3 -m venv "$BRAIN_VENV"
    "$BRAIN_VENV/bin/pip" install --quiet --disable-pip-version-check "$source"
    # What the unit's Documentation= points to.
    install -d -m 0755 /usr/share/doc/brain
    install -m 0644 "$HERE/../docs/kubernetes.md" /usr/share/doc/brain/kubernetes.md
    say "installed $("$BRAIN_VENV/bin/brain" --version | head -1) as $BRAIN_VENV/bin/brain"
}

step_user() {
    if id -u "$BRAIN_USER" >/dev/null 2>&1; then
        [ "$(id -u "$BRAIN_USER")" = "$BRAIN_UID" ] ||
            say "warning: user $BRAIN_USER exists with uid $(id -u "$BRAIN_USER"), not $BRAIN_UID (the static pod runs as $BRAIN_UID)"
        return
    fi
    # 65532 is above Debian's system range (999): say so, or useradd warns.
    groupadd --system -K SYS_GID_MAX="$BRAIN_UID" --gid "$BRAIN_UID" "$BRAIN_USER"
    useradd --system -K SYS_UID_MAX="$BRAIN_UID" --uid "$BRAIN_UID" --gid "$BRAIN_UID" --home-dir "$BRAIN_DATA" \
        --no-create-home --shell /usr/sbin/nologin "$BRAIN_USER"
    say "created user $BRAIN_USER ($BRAIN_UID:$BRAIN_UID)"
}

# sign CSR_STEM EXTENSIONS: a certificate for $work/CSR_STEM.csr, signed by the CA.
sign() {
    printf '%s\n' "$2" >"$work/$1.ext"
    openssl x509 -req -in "$work/$1.csr" -CA "$BRAIN_PKI_DIR/ca.crt" -CAkey "$BRAIN_CA_KEY" \
        -set_serial "0x$(openssl rand -hex 16)" -days "$BRAIN_CERT_DAYS" -extfile "$work/$1.ext" \
        -out "$work/$1.crt" 2>/dev/null
}

step_pki() {
    command -v openssl >/dev/null || die "openssl is needed: apt-get install openssl"
    id -u "$BRAIN_USER" >/dev/null 2>&1 ||
        die "user $BRAIN_USER (who gets server.key) does not exist: run '$0 user' first, or name another user" \
            "with BRAIN_USER=... (docs/kubernetes.md, \"The script's settings\")"
    [ -e "$BRAIN_PKI_DIR/server.crt" ] && die "$BRAIN_PKI_DIR/server.crt exists; remove $BRAIN_PKI_DIR to make new certificates"
    install -d -m 0755 "$BRAIN_PKI_DIR" "$KUBE_PKI_DIR"
    install -d -m 0700 "$(dirname "$BRAIN_CA_KEY")"
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' RETURN
    local ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
    # The CA: signs brain's serving certificate and the apiserver's client certificate.
    (umask 077; openssl req -x509 "${ec[@]}" -days 3650 -subj /CN=brain-ca \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$BRAIN_CA_KEY" -out "$work/ca.crt" 2>/dev/null)
    install -m 0644 "$work/ca.crt" "$BRAIN_PKI_DIR/ca.crt"
    # brain's serving certificate; its key readable by the brain user only.
    openssl req "${ec[@]}" -subj /CN=brain -keyout "$work/server.key" -out "$work/server.csr" 2>/dev/null
    sign server "$(printf 'subjectAltName=%s\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth' "$BRAIN_SANS")"
    install -m 0644 "$work/server.crt" "$BRAIN_PKI_DIR/server.crt"
    install -m 0600 -o "$BRAIN_USER" -g "$(id -g "$BRAIN_USER")" "$work/server.key" "$BRAIN_PKI_DIR/server.key"
    # kube-apiserver's client certificate (--etcd-certfile/--etcd-keyfile).
    openssl req "${ec[@]}" -subj /CN=kube-apiserver-brain-client -keyout "$work/client.key" \
        -out "$work/client.csr" 2>/dev/null
    sign client "$(printf 'keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth')"
    install -m 0644 "$work/client.crt" "$KUBE_PKI_DIR/apiserver-brain-client.crt"
    install -m 0600 "$work/client.key" "$KUBE_PKI_DIR/apiserver-brain-client.key"
    say "wrote $BRAIN_PKI_DIR/{ca.crt,server.crt,server.key}, $KUBE_PKI_DIR/apiserver-brain-client.{crt,key}; CA key $BRAIN_CA_KEY"
}

step_systemd() {
    [ -x "$BRAIN_VENV/bin/brain" ] || die "$BRAIN_VENV/bin/brain is missing: run '$0 install' first"
    [ -r "$BRAIN_PKI_DIR/server.key" ] || die "no certificates in $BRAIN_PKI_DIR: run '$0 pki' first"
    install -m 0644 "$HERE/brain.service" /etc/systemd/system/brain.service
    if [ -d /run/systemd/system ]; then  # booted with systemd
        systemctl daemon-reload
        systemctl enable --now brain.service
    else  # an image being prepared, a chroot: it starts at the next boot
        systemctl enable brain.service
        say "systemd is not running here: brain.service is enabled and starts at boot"
    fi
}

step_static_pod() {
    id -u "$BRAIN_USER" >/dev/null 2>&1 || die "user $BRAIN_USER does not exist: run '$0 user' first"
    [ "$(id -u "$BRAIN_USER")" = 65532 ] || die "the static pod runs as uid 65532, but $BRAIN_USER is uid $(id -u "$BRAIN_USER")"
    [ -r "$BRAIN_PKI_DIR/server.key" ] || die "no certificates in $BRAIN_PKI_DIR: run '$0 pki' first"
    # hostPath volumes keep the host's ownership (fsGroup does not apply to
    # them), so the data dir is made the pod user's here.
    install -d -m 0700 -o "$BRAIN_USER" -g "$(id -g "$BRAIN_USER")" "$BRAIN_DATA"
    install -d -m 0755 /etc/kubernetes/manifests
    install -m 0600 "$HERE/brain-static-pod.yaml" /etc/kubernetes/manifests/brain.yaml
    say "wrote /etc/kubernetes/manifests/brain.yaml; the kubelet starts it (image localhost/brain:0.1.0, see deploy/Dockerfile)"
}

[ $# -gt 0 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        install)
            if [ $# -gt 1 ] && ! [[ "$2" =~ ^(user|pki|systemd|static-pod)$ ]]; then step_install "$2"; shift; else step_install; fi ;;
        user) step_user ;;
        pki) step_pki ;;
        systemd) step_systemd ;;
        static-pod) step_static_pod ;;
        *) die "unknown step '$1' (install, user, pki, systemd, static-pod)" ;;
    esac
    shift
done
