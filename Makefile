# brain: the two entry points are `make serve` and `make test`.
#
# Both run in the checkout's own venv, ./.venv, which the first of them makes
# from the python3 on PATH (3.11 or newer; Debian: apt-get install
# python3-venv): `make serve` installs brain with its runtime dependencies
# into it, `make test` adds the test extras (pytest, hypothesis, ...).
# PYTHON=/path/to/python runs everything with that interpreter instead, and
# makes no venv.
VENV = .venv
PYTHON ?= $(VENV)/bin/python
PIP ?= $(PYTHON) -m pip
# brain serve's flags for `make serve`, e.g. ARGS='--listen-client-urls http://127.0.0.1:12379'
ARGS ?=

.PHONY: serve test venv deps deps-fuzz deps-python deps-serve deps-system deps-etcd36 deps-etcd37 proto proto-check test-full e2e clean distclean native

serve: deps-serve             ## run brain on its defaults (http://localhost:2379, i.e. 127.0.0.1:2379; ./default.brain), or with ARGS='brain serve flags'
	$(PYTHON) -m brain serve $(ARGS)

# -rfEs: the summary at the end lists failures, errors and every skipped test
# with its reason (under CI=true a missing tool or service fails instead).
# `make test` leaves out the cargo-fuzz targets (fuzz_rust: cargo-fuzz's cold
# install and the targets' build take minutes; brain-wire's unit tests, with
# every input the fuzzers found, do run); `make test-full` runs them.
PYTEST = $(PYTHON) -m pytest -q -p no:cacheprovider -rfEs --durations=25

test: deps deps-etcd36 deps-etcd37 cluster-tools  ## everything CI runs (tests/k8s is `make e2e`)
	$(PYTHON) -m brain.api.genproto --check
	$(PYTEST) -m "not k8s and not fuzz_rust"

test-full: deps deps-etcd36 deps-etcd37 cluster-tools deps-fuzz  ## the long versions: 20+ crash cycles, 4 full-disk and lmdb-fault rounds, more differential seeds (and the harness self-check on every etcd), 10 partition rounds, 24 cluster leader kills, the benchmark smoke on every server, 5 min per fuzz target and 1000 random RPC sequences per listener kind, the auth session on grpcio and 200 auth property examples
	BRAIN_CRASH_CYCLES=25 BRAIN_DISK_CYCLES=4 DIFF_OPS=2000 BRAIN_BENCH_SMOKE=all BRAIN_PARTITION_ROUNDS=10 \
		BRAIN_CLUSTER_KILLS=24 BRAIN_FUZZ_SECONDS=300 BRAIN_RPC_SEQUENCES=1000 BRAIN_ABUSE_SECONDS=120 BRAIN_AUTH_FULL=1 \
		HYPOTHESIS_AUTH_EXAMPLES=200 $(PYTEST) -m "not k8s"

e2e: deps-python               ## real kube-apiserver + controllers + kwok on brain (tests/k8s; needs Go, builds Kubernetes once, ~8 min cold)
	BRAIN_E2E=1 $(PYTHON) -m pytest -q -s -rs -p no:cacheprovider -m k8s tests/k8s

.PHONY: cluster cluster-tools cluster-test
cluster: deps-serve               ## a local 3-replica brain cluster on 3 nats-servers (deploy/local-cluster.sh; Ctrl-C stops it)
	PYTHON=$(PYTHON) bash deploy/local-cluster.sh

cluster-tools:                ## nats-server 2.15, clustercheck and etcd 3.6 for the cluster tests (Go, cached: .cache/nats, .cache/cluster, .cache/bench)
	bash tests/cluster/build.sh
	bash benchmarks/build.sh etcd-3.6

cluster-test: deps cluster-tools  ## the cluster tests alone (tests/cluster: NATS and etcd clusters, clustercheck)
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/cluster

.PHONY: bench bench-smoke
bench: deps                   ## brain vs etcd 3.4, 3.6, 3.7 and kine (plaintext; mutual TLS with etcd 3.6/3.7 also on the fast gRPC listener), brain vs etcd 3.6 clusters, 100 min (measured) plus about 8 min for the cluster groups' isolations, nats-server restarts and lease-off reads, 40 min for the 1M-key scale group and 70-80 min for the node-capacity groups (estimated): benchmarks/results/<date>.md, plots, README table
	$(PIP) install -q --disable-pip-version-check -e '.[test,bench]'
	bash benchmarks/build.sh
	bash tests/cluster/build.sh
	$(PYTHON) -m benchmarks.run

bench-smoke: deps             ## every benchmark workload for a second on each server and cluster (6-10 min; what tests/benchmarks runs under make test-full)
	$(PIP) install -q --disable-pip-version-check -e '.[test,bench]'
	bash benchmarks/build.sh
	bash tests/cluster/build.sh
	$(PYTHON) -m benchmarks.run --smoke

deps: deps-system deps-python

# cargo-fuzz, for tests/fuzz's Rust targets (native/fuzz): built from its
# crate once (a few minutes on 2 cores), then found on PATH.  The targets run
# with -s none (no sanitizer), which stable Rust builds.
CARGO_FUZZ_VERSION = 0.13.2
deps-fuzz:                    ## cargo-fuzz $(CARGO_FUZZ_VERSION) (cargo install; cold ~3-5 min, then < 1 s)
	@cargo fuzz --version 2>/dev/null | grep -qF '$(CARGO_FUZZ_VERSION)' || \
		nice cargo install --locked --quiet cargo-fuzz --version $(CARGO_FUZZ_VERSION)

deps-etcd36:                  ## etcd 3.6.16, the second differential oracle (benchmarks/build.sh; cold ~4 min, cached < 1 s)
	bash benchmarks/build.sh etcd-3.6 >/dev/null

deps-etcd37:                  ## etcd, etcdctl and etcdutl 3.7.3 (the version brain behaves as): the third differential oracle, the migration tests' newest etcd (benchmarks/build.sh; cold ~1-4 min, cached < 1 s)
	bash benchmarks/build.sh etcd-3.7 >/dev/null

# The checkout's venv, unless PYTHON names another interpreter.
venv:
	@if [ "$(PYTHON)" = "$(VENV)/bin/python" ] && [ ! -x "$(VENV)/bin/python" ]; then \
		command -v python3 >/dev/null || { echo "python3 (3.11 or newer) is needed: apt-get install python3 python3-venv" >&2; exit 1; }; \
		python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
			{ echo "brain needs Python 3.11 or newer; python3 is $$(python3 --version 2>&1)" >&2; exit 1; }; \
		python3 -c 'import ensurepip' 2>/dev/null || \
			{ echo "python3 -m venv needs ensurepip: apt-get install python3-venv" >&2; exit 1; }; \
		echo "python3 -m venv $(VENV)"; \
		python3 -m venv $(VENV); \
	fi

# pip builds brain._transport (native/, Rust) with maturin as part of the
# editable install: cargo fetches crates, builds into .cache/cargo-target
# (CARGO_TARGET_DIR overrides: several checkouts can share one cache) and the
# module lands in brain/.  Cold: a few minutes on 2 cores; then seconds.
# deps-serve installs what serving needs and shows cargo's lines (pip -v:
# the first build is minutes); deps-python adds the test extras, quietly.
deps-serve: venv
	@echo "cargo builds brain's Rust transport (native/) inside this install: minutes the first time on 2 cores, then seconds"
	$(PIP) install -v --disable-pip-version-check -e .

deps-python: venv
	@# The distribution was called brain before it became brain-etcd: drop such an install of ours
	@# (never the unrelated package of that name) so that one distribution provides the package.
	@if $(PIP) show brain 2>/dev/null | grep -q 'etcd v3 API'; then $(PIP) uninstall -y -q brain; fi
	$(PIP) install -q --disable-pip-version-check -e '.[test]'

native:                       ## rebuild only brain._transport in place (after editing native/), without pip
	cargo build --release --manifest-path native/Cargo.toml
	cp "$${CARGO_TARGET_DIR:-.cache/cargo-target}/release/lib_transport.so" brain/_transport.abi3.so.new
	mv -f brain/_transport.abi3.so.new brain/_transport.abi3.so  # a new file: running servers keep theirs

# etcd and etcdctl: the differential oracle and the CLI client. fiu-utils and strace: fdatasync
# failure injection (tests/crash). openssl, python3-venv, python3-yaml, systemd-container
# (systemd-nspawn) and iproute2: tests/deploy, which runs deploy/brain-node.sh in a scratch root
# and boots the systemd unit there.
SYSTEM_PACKAGES = etcd-server etcd-client fiu-utils strace openssl python3-venv python3-yaml systemd-container iproute2

deps-system:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | \
		grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

proto: deps-python           ## regenerate brain/api/pb from proto/
	$(PYTHON) -m brain.api.genproto

proto-check: deps-python
	$(PYTHON) -m brain.api.genproto --check

clean:                        ## what serve, cluster, builds and tests leave in the tree (seconds to remake; the Rust module: a minute)
	rm -rf default.brain cluster.brain build *.egg-info .pytest_cache .hypothesis tmp brain/_transport*.so
	find . -name __pycache__ -type d -not -path './.cache/*' -prune -exec rm -rf {} +

distclean: clean              ## also .venv and .cache: the venv, the Kubernetes, benchmark and cargo builds (~2 GB; ~10 min to rebuild)
	rm -rf .cache $(VENV)
