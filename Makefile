# The two commands: `make run` (the main job) and `make test` (the test suite).
# Each builds .venv the first time (TensorFlow, PySpark, Horovod from source); later runs install nothing.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.tfnet-installed
TESTS  ?= tests
PYTEST_ARGS ?=
# pytest workers (pytest-xdist), in three lanes (tests/conftest.py): the first runs every test module but pytest.ini's
# one_core_modules and beside_modules, one test after another as one process would; the second runs the
# one_core_modules, in-process TensorFlow modules that keep one core busy, with TensorFlow at one thread, beside it,
# then the beside_modules (Spark modules that use nothing the whole machine shares). TEST_WORKERS=0 runs one process.
TEST_WORKERS ?= 2

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
