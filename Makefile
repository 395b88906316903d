# brain: the two entry points are `make serve` and `make test`.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: serve test deps deps-python deps-system proto proto-check test-full e2e clean native

serve: deps-python            ## run brain on its embedded default (127.0.0.1:2379, ./default.brain)
	$(PYTHON) -m brain serve

test: deps                    ## everything CI runs
	$(PYTHON) -m brain.api.genproto --check
	$(PYTHON) -m pytest -q -p no:cacheprovider

test-full: deps               ## the long versions: 20+ crash cycles, more differential seeds
	BRAIN_CRASH_CYCLES=25 DIFF_OPS=2000 $(PYTHON) -m pytest -q -p no:cacheprovider

e2e: deps-python               ## real kube-apiserver + controllers + kwok on brain (tests/k8s; needs Go, builds Kubernetes once, ~8 min cold)
	BRAIN_E2E=1 $(PYTHON) -m pytest -q -s -rs -p no:cacheprovider -m k8s tests/k8s

.PHONY: bench bench-smoke
bench: deps                   ## brain vs etcd 3.4, etcd 3.6 and kine, ~40 min: benchmarks/results/<date>.md, plots, README table
	$(PIP) install -q --disable-pip-version-check -e '.[test,bench]'
	bash benchmarks/build.sh
	$(PYTHON) -m benchmarks.run

bench-smoke: deps             ## every benchmark workload for a second on each server (~1.5 min; what the pytest in tests/benchmarks runs)
	$(PIP) install -q --disable-pip-version-check -e '.[test,bench]'
	bash benchmarks/build.sh
	$(PYTHON) -m benchmarks.run --smoke

deps: deps-system deps-python

# pip builds brain._transport (native/, Rust) with maturin as part of the
# editable install: cargo fetches crates, builds into .cache/cargo-target
# (CARGO_TARGET_DIR overrides: several checkouts can share one cache) and the
# module lands in brain/.  Cold: a few minutes on 2 cores; then seconds.
deps-python:
	$(PIP) install -q --disable-pip-version-check -e '.[test]'

native:                       ## rebuild only brain._transport in place (after editing native/), without pip
	cargo build --release --manifest-path native/Cargo.toml
	cp "$${CARGO_TARGET_DIR:-.cache/cargo-target}/release/lib_transport.so" brain/_transport.abi3.so.new
	mv -f brain/_transport.abi3.so.new brain/_transport.abi3.so  # a new file: running servers keep theirs

deps-system:                  ## etcd and etcdctl: the differential oracle and the CLI client
	@if ! command -v etcd >/dev/null 2>&1 || ! command -v etcdctl >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server etcd-client; \
	fi

proto:                        ## regenerate brain/api/pb from proto/
	$(PYTHON) -m brain.api.genproto

proto-check:
	$(PYTHON) -m brain.api.genproto --check

clean:
	rm -rf default.brain build *.egg-info .pytest_cache .hypothesis brain/_transport*.so
