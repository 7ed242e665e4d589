# The two commands of the README: `make demo` and `make test`. Everything else here
# is a faster target for daily work.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
export CONTAINERS_CONF := $(CURDIR)/sandbox/containers.conf
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# molecule and ansible-lint call ansible-config, ansible-galaxy... by name.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Python keeps the tool's bytecode, as on a user's machine: with PYTHONDONTWRITEBYTECODE set
# (as on some CI machines) each of the tests' hundreds of tool commands would compile the
# tool again first (0.15-0.25 s of CPU each).
unexport PYTHONDONTWRITEBYTECODE
SCENARIO ?= common
# What the tool and its sandbox need on this machine (make demo), then what only the tests
# add: nfs-ls (the share reached with another uid) and chromium (the reports' screenshots).
SYSTEM_PACKAGES := podman runc debootstrap rsync openssh-client python3-venv unionfs-fuse fuse3
TEST_PACKAGES := $(SYSTEM_PACKAGES) libnfs-utils chromium

.PHONY: help deps test-deps venv test-venv lint unit molecule molecule-all sandbox-tests e2e test-extended bench test demo clean

help:
	@echo "make demo            2-node sandbox cluster: provision it and train on it"
	@echo "make test            everything CI runs: lint, unit, molecule, sandbox and e2e tests"
	@echo "make unit            unit tests only (about 2 minutes)"
	@echo "make sandbox-tests   orchestrator and e2e tests on one provisioned sandbox cluster"
	@echo "make test-extended   the scenarios of several minutes that make test leaves out"
	@echo "make bench           benchmarks (results in bench/results/)"
	@echo "make lint            ansible-lint (production profile), syntax checks, ruff and mypy"
	@echo "make molecule SCENARIO=common   one molecule scenario"
	@echo "make clean           remove the virtualenv and caches (not sandboxes)"

# System packages (Debian/Ubuntu). Skipped when everything is already there.
deps test-deps: PACKAGES = $(if $(filter test-deps,$@),$(TEST_PACKAGES),$(SYSTEM_PACKAGES))
deps test-deps:
	@missing=$$(for p in $(PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages: $$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

# The tool alone (make demo: the controller needs neither torch nor the test tools), then
# the extras that the tests and benchmarks use. --no-compile: Python compiles a module when
# it is first imported, and most of these packages' files never are (pip compiling all of
# them took 35 of the 55 s of a fresh install here: ansible's collections, torch).
PIP_INSTALL := $(BIN)/pip install -q --no-compile
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP_INSTALL) -e '.[test,train]'
	touch $@

venv: $(VENV)/.installed
test-venv: $(VENV)/.installed-test

# ruff and mypy read their settings from pyproject.toml ([tool.ruff], [tool.mypy]).
lint: test-venv
	$(BIN)/ansible-lint
	$(BIN)/ansible-playbook --syntax-check -i inventory/hosts.yml site.yml
	$(BIN)/ruff check .
	$(BIN)/mypy

# Pure unit tests: about two minutes on 2 cores. `make test` also runs the slow ones.
# deps: some use rsync and debootstrap on this machine. Two at a time (pytest-xdist): many
# wait on real processes rather than use a core.
# A file at a time on each (loadfile): a file's module and session fixtures are made once, not
# on each worker (pytest-xdist's loadgroup groups nothing under pytest 9: its mark is lost).
PYTEST_UNIT := $(BIN)/pytest -n 2 --dist loadfile -q
unit: test-deps test-venv
	$(PYTEST_UNIT) -m "not sandbox and not e2e and not slow"

molecule: test-deps test-venv
	cd $(CURDIR) && $(BIN)/molecule test -s $(SCENARIO)

# Sandbox and end-to-end tests in one session: they share a cluster provisioned by site.yml.
# One at a time on a cluster: they share its nodes, and some measure their speed. LANES=2
# (make test) runs two at once, each on a cluster of its own (CLUSTERTRAIN_TEST_SANDBOX=A,B),
# a test file at a time per lane.
SANDBOX_SELECT ?= sandbox or e2e
LANES ?= 1
sandbox-tests: test-deps test-venv
	$(BIN)/pytest -m "$(SANDBOX_SELECT)" -q --durations=30 \
	  $(if $(filter-out 1,$(LANES)),-n $(LANES) --dist loadfile --no-loadscope-reorder)

# The scenarios whose converge or checks are not the shared cluster's: `firewall`
# (node-by-node admin networks, the rollback), `common` (members in /etc/hosts; the shared
# cluster resolves them by DNS), `nfs` (the outsider reaches the NFS port: no firewall)
# and `nvidia_driver` (its test double). The others (`default`, `slurm`, `python_env`)
# converge the playbooks site.yml runs, with the same group_vars: `make test`'s sandbox tests converge site.yml once on their shared cluster
# and run those scenarios' verify.yml there (tests/roles/test_site_sandbox.py).
# `make molecule SCENARIO=NAME` still runs any of them on a cluster of its own.
# Two at a time (each has its own sandbox, network and subnet; they mostly wait on
# containers and SSH), longest first; each one's output is printed whole when it ends.
MOLECULE_SCENARIOS := firewall nfs common nvidia_driver
MOLECULE_JOBS ?= 2
molecule-all: test-deps test-venv
	@mkdir -p .cache/molecule-logs
	printf '%s\n' $(MOLECULE_SCENARIOS) | xargs -P $(MOLECULE_JOBS) -I{} sh -c \
	  'log=.cache/molecule-logs/{}.log; start=$$(date +%s); $(BIN)/molecule test -s {} >$$log 2>&1; \
	   rc=$$?; cat $$log; echo "molecule {}: exit $$rc after $$(( $$(date +%s) - start )) s"; exit $$rc'

e2e: test-deps test-venv
	$(BIN)/pytest -m e2e -q

# The extended scenarios (marker `extended`; docs/sandbox.md names them and says why): each
# takes several minutes, so `make test` leaves them out. On a cluster of their own, made as
# make test's are (tests/shared_cluster.py) and removed at the end, one test at a time:
# about 20 minutes on 2 cores (2026-12-07: site.yml 221 s, the scenarios 878 s).
test-extended: test-deps test-venv
	@mkdir -p .cache; \
	name=$${CLUSTERTRAIN_TEST_SANDBOX_PREFIX:-}cl-$$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')-x; \
	trap '$(PY) -m tests.shared_cluster down '"$$name"' >/dev/null 2>&1' EXIT; \
	echo "making the cluster $$name ($(SHARED)-extended.log)"; \
	$(PY) -m tests.shared_cluster up $$name >$(SHARED)-extended.json \
	  2>$(SHARED)-extended.log || { cat $(SHARED)-extended.log; exit 1; }; \
	cat $(SHARED)-extended.log; \
	CLUSTERTRAIN_TEST_SANDBOX=$$name $(BIN)/pytest -m extended -q --durations=0

# All benchmarks, one after another (about three and a half hours on 2 cores, a third of it the 2x50
# runs of teardown_abort.py); results in bench/results/.
bench: test-deps test-venv
	$(PY) bench/ddp_overhead.py
	$(PY) bench/steptime_paired.py
	$(PY) bench/launch_fanout.py
	$(PY) bench/launch_fanout.py --bastion
	$(PY) bench/train_overhead.py
	$(PY) bench/preflight_vs_ping.py
	$(PY) bench/kill9_supervision.py
	$(PY) bench/code_sync.py
	$(PY) bench/provision.py --nodes 2
	$(PY) bench/provision.py --nodes 8
	$(PY) bench/teardown_abort.py
	$(PY) bench/queue_overhead.py
	$(PY) bench/env_create.py
	$(PY) bench/report.py
	$(PY) bench/ring_mac.py

# Everything CI runs (.ci/run calls this). The sandbox tests' two shared clusters
# (tests/shared_cluster.py: sandbox up, then their site.yml runs at once) are made in the
# background while the unit tests run (in a session of its own, so that a failing unit stage
# stops it; the clusters are removed on every exit). Once the unit tests pass, at nice 19
# (what the clusters and the sandbox tests leave of the cores), their output kept until the
# end: lint (CPU only, nothing timed), the sandbox tests that make sandboxes of their own
# (marker own_sandbox), then molecule's scenarios one at a time (they mostly wait on
# containers and SSH). Begun there, not once the clusters are ready, they end with the
# sandbox tests rather than a minute after them (the unit tests ended 45 s before the
# clusters were ready, measured). Once the clusters are ready, the sandbox tests in two
# lanes, each on a cluster of its own (a test file at a time, the files with a long test
# first; each lane's time per file is printed at the end), all but the `extended` scenarios
# (make test-extended; docs/sandbox.md). The cores are busy throughout: two lanes on two
# cores, no more. The tests send Ctrl-C to the trains they start, which SIGINT ignored by a
# background start would defeat: tests/conftest.py restores it. The failed tests are named
# again at the very end.
FAILED := .cache/failed-tests
SHARED := .cache/shared-cluster
test: test-deps test-venv
	@mkdir -p .cache/molecule-logs; \
	rm -f $(SHARED).* $(FAILED) .cache/molecule-logs/all.log; \
	export CLUSTERTRAIN_TEST_FAILURES=$(CURDIR)/$(FAILED); \
	name=$${CLUSTERTRAIN_TEST_SANDBOX_PREFIX:-}cl-$$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n'); \
	names="$$name-a $$name-b"; \
	trap '$(PY) -m tests.shared_cluster down '"$$names"' >/dev/null 2>&1' EXIT; \
	failed() { [ -s $(FAILED) ] && { echo "the failed tests (their output is above):"; \
	  cat $(FAILED); }; }; \
	echo "making the shared clusters $$names beside the unit tests ($(SHARED).log)"; \
	setsid sh -c '$(PY) -m tests.shared_cluster up $$1 >$(SHARED).json 2>$(SHARED).log; \
	  echo $$? >$(SHARED).rc' sh "$$names" & prov=$$!; started=$$(date +%s); \
	$(PYTEST_UNIT) -m "not sandbox and not e2e" --durations=10; rc=$$?; \
	echo "the unit tests ended $$(( $$(date +%s) - started )) s after they were begun"; \
	if [ $$rc -ne 0 ]; then kill -TERM -- -$$prov 2>/dev/null; wait $$prov; failed; \
	  exit $$rc; fi; \
	( nice -n 19 $(MAKE) --no-print-directory lint; lint=$$?; \
	  nice -n 19 $(BIN)/pytest -m own_sandbox -q -p no:cacheprovider \
	    --basetemp=.cache/own-sandbox-tmp; own=$$?; \
	  nice -n 19 $(MAKE) --no-print-directory molecule-all MOLECULE_JOBS=1; \
	  mol=$$?; [ $$lint -eq 0 ] && [ $$own -eq 0 ] && [ $$mol -eq 0 ] \
	) >.cache/molecule-logs/all.log 2>&1 & \
	molecule=$$!; \
	wait $$prov; cat $(SHARED).log; \
	echo "the shared clusters were ready $$(( $$(date +%s) - started )) s after they were begun"; \
	if [ "$$(cat $(SHARED).rc 2>/dev/null)" = 0 ]; then \
	  CLUSTERTRAIN_TEST_SANDBOX=$$name-a,$$name-b $(MAKE) --no-print-directory sandbox-tests \
	    LANES=2 SANDBOX_SELECT="(sandbox or e2e) and not own_sandbox and not extended"; rc=$$?; \
	else echo "the shared clusters could not be made: no sandbox test ran"; rc=1; fi; \
	wait $$molecule; mol=$$?; \
	cat .cache/molecule-logs/all.log; \
	echo "sandbox tests: exit $$rc; lint, own-sandbox tests and molecule: exit $$mol"; \
	failed; [ $$rc -eq 0 ] && [ $$mol -eq 0 ]

demo: deps venv
	bash sandbox/demo.sh

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache

# The soak (issue 69, "a month in an hour"; bench/soak/): a 4-node sandbox with Slurm and
# users alice (admin), bob, carol and dave, provisioned as the sandbox tests' clusters are;
# the seed's MINUTES of schedule (researchers, admin, nemesis, attacks) run on it, then its
# invariants checked; the sandbox removed. Results in bench/results/soak-SEED/
# (report.html, verdicts.json, history.jsonl). Not part of `make test`.
SEED ?= 1
MINUTES ?= 60
.PHONY: soak
soak: test-deps test-venv
	$(PY) -m bench.soak.run --seed $(SEED) --minutes $(MINUTES)
