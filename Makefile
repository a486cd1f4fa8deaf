# One command sets up and runs the local default; one passes the tests (README "Two commands").
#   make run        set up what is missing, then train the embedded default (digits_local)
#   make test       set up what is missing (isolated hosts' images too), then run the whole test
#                   suite but the headline sweep, listing the 25 slowest tests
#   make test-fast  the tier to run while working: no TensorFlow cluster, no root or namespaces,
#                   nothing slow (markers in pyproject.toml; docs/contributing.md)
#   make ci         what CI runs (.ci/run): dry-run every committed experiment, lint, test, test-resume,
#                   test-outage, gce-fake
#   make test-outage  the orchestrator's own network dropped mid-run (SSH hosts, fake cloud), hosts lost
#   make gce-fake   the headline sweep on a fake Google Cloud, and a sweep killed and resumed there (docs/gce.md)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
LOGDIR ?= outputs

PACKAGES := orchestrator provisioning trainer analysis hydra_plugins bench
EXPERIMENTS := $(sort $(basename $(notdir $(wildcard experiments/*.yaml))))

.PHONY: setup bytecode isolated-images run test test-fast test-resume test-outage gce-fake validate dry-run ci bench lint tensorboard clean help

help:
	@echo "make setup | bytecode | isolated-images | run | test | test-fast | test-resume | test-outage | gce-fake | validate | dry-run | ci | bench | lint | tensorboard | clean"

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 required"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# PYTHONWARNINGS: setuptools announces every editable install of a flat layout with a
	@# warning that says nothing is wrong ("Editable installation ..."); other warnings still show
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet -e '.[cpu,dev]'
	@touch $(STAMP)

# Our packages' bytecode, compiled ahead: every role of every run imports them, and where
# PYTHONDONTWRITEBYTECODE is set (CI images, some containers) Python never caches it itself
# (0.3 CPU s per orchestrator start). Only changed files are recompiled; a stale file is
# simply recompiled in memory.
bytecode: setup
	@$(PY) -m compileall -q $(PACKAGES) > /dev/null

# The isolated test hosts' Debian 12 and 13 root filesystems (tests/testbed/images.py: built
# with debootstrap when missing, about 2 min each, 50 MB from the Debian mirror), and the image
# with the hosts' runtime baked in (tests/testbed/baked.py; the SSH and GCE fault end-to-end
# tests boot it): each built once per machine, cached in /var/tmp/transient-isobed outside the
# checkout; a no-op once cached or when not root
isolated-images: setup
	$(PY) -m tests.testbed.images build
	$(PY) -m tests.testbed.baked build

run: bytecode
	$(PY) -m orchestrator +experiment=digits_local

# on TEST_JOBS processes (pytest-xdist; TEST_JOBS=0 runs in this one): most of the suite waits
# on multi-process runs and booting hosts rather than computing, so two processes on two cores
# finish well inside CI's budget. A file's tests stay on one process (--dist loadfile): a module's
# bed of hosts is built once; beds claim their own names and /24 (tests/testbed)
TEST_JOBS ?= 2
test: bytecode
	bash .ci/testbed-deps  # sshd + iproute2 for the SSH test bed, when missing
	$(MAKE) --no-print-directory isolated-images
	$(PY) -m pytest -m "not (headline or resume_matrix or outage)" -n $(TEST_JOBS) --dist loadfile \
	  --durations=25 $(PYTEST_ARGS)

# --resume on the parallel launcher, a recovery, SSH, the fake cloud and the local sweep killed
# at 12 points (about 9 min): kept out of `make test` to hold it inside CI's 25 minutes;
# `make ci` runs it
test-resume: bytecode
	bash .ci/testbed-deps
	$(PY) -m pytest -m resume_matrix tests/orchestrator/test_resume.py --durations=10 $(PYTEST_ARGS)

# The orchestrator's own network dropped for 20 s and 120 s mid-training, over SSH on isolated
# hosts and on the fake cloud, and an SSH host's link cut or its machine frozen or killed
# (about 15 min): kept out of `make test` for its 25 minutes;
# `make ci` runs it
test-outage: bytecode
	bash .ci/testbed-deps
	$(MAKE) --no-print-directory isolated-images
	$(PY) -m pytest -m outage tests/orchestrator/test_ssh_e2e.py tests/provisioning/test_gce_outage.py \
	  --durations=10 $(PYTEST_ARGS)

# Tiers by what a test needs (pyproject.toml markers): the fast one leaves out every marked test
FAST_TIER := not (slow or tf_cluster or namespaces or isolated or headline or outage)

# on FAST_JOBS processes (pytest-xdist; FAST_JOBS=0 runs in this one)
FAST_JOBS ?= 2
test-fast: setup
	$(PY) -m pytest -m "$(FAST_TIER)" -n $(FAST_JOBS) --durations=10 $(PYTEST_ARGS)

# The headline sweep (+experiment=cifar10_res32 -m cluster.workers=4,8,16) end to end against
# the fake Compute API, isolated hosts from a baked image as its VMs and the GCS emulator (root);
# the same sweep detached on a controller VM (tests/provisioning/test_gce_detach.py)
gce-fake: bytecode
	bash .ci/testbed-deps
	$(MAKE) --no-print-directory isolated-images
	$(PY) -m pytest -m headline tests/provisioning/test_gce_headline.py tests/provisioning/test_gce_detach.py \
	  tests/provisioning/test_gce_controller.py tests/orchestrator/test_controller_agent.py \
	  tests/orchestrator/test_controller_submit.py tests/orchestrator/test_controller_cli.py \
	  tests/orchestrator/test_resume.py -s $(PYTEST_ARGS)

validate: setup
	$(PY) -m orchestrator.validate

# Every committed experiment through the real command in dry-run mode (plan only, nothing
# provisioned); a bad one prints its one-line config error and fails the target.
dry-run: setup
	@failed=""; for e in $(EXPERIMENTS); do \
	  if $(PY) -m orchestrator +experiment=$$e dry_run=true progress=false > /dev/null; \
	  then echo "dry run ok   $$e"; else echo "dry run FAIL $$e"; failed="$$failed $$e"; fi; \
	done; test -z "$$failed" || { echo "failed dry runs:$$failed"; exit 1; }

ci: dry-run lint test test-resume test-outage gce-fake

bench: bytecode
	$(PY) -m bench

lint: setup
	$(PY) -m ruff check .

# The runs' training curves at http://localhost:6006 (sweeps: make tensorboard LOGDIR=multirun)
tensorboard: setup
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/tensorboard --logdir $(LOGDIR)

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache
