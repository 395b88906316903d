# brain: the two entry points are `make serve` and `make test`.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: serve test deps deps-python deps-system deps-etcd36 proto proto-check test-full e2e clean

serve: deps-python            ## run brain on its embedded default (127.0.0.1:2379, ./default.brain)
	$(PYTHON) -m brain serve

# -rfEs: the summary at the end lists failures, errors and every skipped test
# with its reason (under CI=true a missing tool or service fails instead).
PYTEST = $(PYTHON) -m pytest -q -p no:cacheprovider -rfEs -m "not k8s"

test: deps deps-etcd36        ## everything CI runs (tests/k8s is `make e2e`)
	$(PYTHON) -m brain.api.genproto --check
	$(PYTEST)

test-full: deps deps-etcd36   ## the long versions: 20+ crash cycles, more differential seeds
	BRAIN_CRASH_CYCLES=25 DIFF_OPS=2000 $(PYTEST)

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

deps-etcd36:                  ## etcd 3.6.16, the second differential oracle (benchmarks/build.sh; cold ~4 min, cached < 1 s)
	bash benchmarks/build.sh etcd-3.6 >/dev/null

deps-python:
	$(PIP) install -q --disable-pip-version-check -e '.[test]'

deps-system:                  ## Debian packages: etcd 3.4 and etcdctl (oracle, CLI), fiu-utils and strace (fdatasync failure injection)
	@missing=""; \
	command -v etcd >/dev/null 2>&1 || missing="$$missing etcd-server"; \
	command -v etcdctl >/dev/null 2>&1 || missing="$$missing etcd-client"; \
	command -v fiu-run >/dev/null 2>&1 || missing="$$missing fiu-utils"; \
	command -v strace >/dev/null 2>&1 || missing="$$missing strace"; \
	if [ -n "$$missing" ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

proto:                        ## regenerate brain/api/pb from proto/
	$(PYTHON) -m brain.api.genproto

proto-check:
	$(PYTHON) -m brain.api.genproto --check

clean:
	rm -rf default.brain build *.egg-info .pytest_cache .hypothesis
