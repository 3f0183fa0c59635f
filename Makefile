# The two commands: `make run` (the main job) and `make test` (the test suite).
# Each builds .venv the first time (TensorFlow, PySpark, Horovod from source); later runs install nothing.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.tfnet-installed
TESTS  ?= tests
PYTEST_ARGS ?=
# pytest workers (pytest-xdist). One process by default: on CI's 2 cores two workers did not shorten the suite (62.4
# min of tests against 50-61 in one process: the cores are already busy, and each test ran 2-3x slower beside another;
# docs/benchmarks.md). TEST_WORKERS=2 runs two: tests/conftest.py keeps each module in one worker and runs the modules
# that use the whole machine's network, Docker engine or shared cluster (pytest.ini) in one worker.
TEST_WORKERS ?= 0

export TF_ENABLE_ONEDNN_OPTS ?= 1
export TF_CPP_MIN_LOG_LEVEL ?= 2
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: run test install benchmark clean docker

install: $(STAMP)

$(STAMP): setup.py scripts/install.sh scripts/build_horovod.sh
	bash scripts/install.sh
	touch $(STAMP)

# `make test TESTS=tests/tfnet PYTEST_ARGS=-x` runs a part of the suite.

# the main job; `make run RUN_ARGS=--resnet50` runs the ResNet-50 benchmark instead
run: $(STAMP)
	$(PY) -m examples.main_job $(RUN_ARGS)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n $(TEST_WORKERS) $(TESTS) $(PYTEST_ARGS)

# the cluster image (docker/README.md); `make test` builds it too, in its docker tier (tests/docker/),
# which starts the Docker engine itself through scripts/docker_env.sh
docker: $(STAMP)
	TFNET_PYTHON=$(abspath $(PY)) bash scripts/docker_build.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
