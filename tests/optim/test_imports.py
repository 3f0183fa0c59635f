"""Import hygiene: which packages each layer pulls in, checked in a fresh interpreter."""

import json
import sys

import pytest

from tests.side_by_side import SideBySide

PROBE = """
import json, sys
import {module}
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j', 'horovod', 'optim'))))
"""


PURE = ["optim", "optim.methods", "optim.transforms", "optim.schedules", "optim.losses", "optim.metrics",
        "optim.errors", "optim.logs", "optim.keras_compat", "optim.optimizer", "optim.training.loop",
        "optim.training.horovod", "optim.arrow", "optim.data", "optim.data.stream", "optim.data.parquet",
        "optim.protocol"]
TRANSPORT = ["optim.transport.auth", "optim.transport.store", "optim.transport.client", "optim.transport.store_address",
             "optim.transport.progress", "optim.transport.progress_store", "optim.transport.failures",
             "optim.transport.chunks"]
DRIVER = ["optim.launch.launcher", "optim.launch.evaluate", "optim.optimizer", "optim.ml.estimator"]
#: What the README writes: ``import optim`` then ``optim.logs.configure(...)``, reaching the modules it names.
README = ("import optim; optim.logs.configure(1); "
          "print(optim.training.loop.__name__, optim.spark.session.__name__, optim.predict.predictor.__name__, "
          "optim.arrow.__name__, optim.keras_compat.__name__)")


@pytest.fixture(scope="module")
def fresh():
    """Every fresh interpreter of the module, started side by side as it begins."""
    runs = SideBySide()
    for name, modules in (("tfnet", ["tfnet"]), ("pure", PURE), ("transport", TRANSPORT), ("driver", DRIVER)):
        runs.start(name, [sys.executable, "-c", PROBE.format(module=", ".join(modules))], timeout=120)
    runs.start("readme", [sys.executable, "-c", README], timeout=120)
    yield runs
    runs.close()


def loaded_by(fresh, name: str) -> list[str]:
    out = fresh.result(name)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tfnet_imports_neither_optim_nor_spark_nor_horovod(fresh):
    assert loaded_by(fresh, "tfnet") == []


def test_pure_modules_import_neither_pyspark_nor_horovod(fresh):
    """All of them in one fresh interpreter (what none of them imports, each alone does not either)."""
    loaded = loaded_by(fresh, "pure")
    assert not [m for m in loaded if m.split(".")[0] in ("pyspark", "py4j", "horovod")], loaded
    assert not [m for m in loaded if m.startswith(("optim.spark", "optim.predict"))], loaded


def test_transport_runs_on_both_sides_without_pyspark(fresh):
    """The channels between the driver and the ranks import neither PySpark nor Horovod (Horovod's
    server only when one starts), nor anything from ``optim.spark``."""
    loaded = loaded_by(fresh, "transport")
    assert not [m for m in loaded if m.split(".")[0] in ("pyspark", "py4j", "horovod")], loaded
    assert not [m for m in loaded if m.startswith("optim.spark")], loaded


def test_the_driver_loads_nothing_of_the_worker_package(fresh):
    """The driver and the ranks meet in ``optim.protocol``: the launcher, the distributed evaluation and the
    optimiser load no module of ``optim.rank`` (the ranks' entry points are named, not imported)."""
    loaded = loaded_by(fresh, "driver")
    assert not [m for m in loaded if m.startswith("optim.rank")], loaded


def test_public_names_still_import_from_optim():
    import optim

    assert optim.TFOptimizer.__module__ == "optim.optimizer"
    assert optim.TFNetTransformer.__module__ == "optim.predict.transformer"
    assert optim.warm_up_workers.__module__ == "optim.spark.warm_up"
    assert set(optim.__all__) <= set(dir(optim))
    with pytest.raises(AttributeError, match=r"module 'optim' has no attribute 'nope'. Public names: "):
        optim.nope  # noqa: B018


def test_one_class_per_error_concept():
    """Every optim error lives in optim.errors; the old homes re-use the same classes."""
    import optim.errors as E
    from optim.data.columns import ColumnError as SparkColumnError
    from optim.data.decode import BadRowError as ShardBadRowError

    assert SparkColumnError is E.ColumnError and ShardBadRowError is E.BadRowError
    import tfnet

    for name in E.__all__:
        obj = getattr(E, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and not issubclass(obj, Warning):
            assert issubclass(obj, tfnet.TFNetError), name


def test_import_optim_reaches_every_module_the_readme_names(fresh):
    """`import optim` then `optim.logs.configure(...)`, as the README writes it, in a fresh interpreter."""
    out = fresh.result("readme")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["optim.training.loop", "optim.spark.session", "optim.predict.predictor",
                                  "optim.arrow", "optim.keras_compat"]
