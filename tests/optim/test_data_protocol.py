"""The TFDataset protocol (issue 55): every road answers the driver's checks (the base has no default for them), says
which capabilities it has, and holds rows out for ``validation_split`` through the base's one ``hold_out``; a
``tf.data`` input is checked from its ``element_spec`` (a function's where it builds its dataset); Parquet's seam for
table formats (``ParquetDataset.from_files``) is what Delta uses. No Spark: the six roads against Spark are
``tests/optim/spark/test_one_road.py``."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import optim
from optim.data.arrays import ArrayDataset
from optim.data.base import CAPABILITIES, DataAdapter
from optim.data.dataframe import DataFrameDataset
from optim.data.delta import DeltaDataset
from optim.data.parquet import ParquetDataset, list_parquet
from optim.data.rdd import RDDDataset
from optim.data.tf_data import TFDataDataset, spec_type
from tfnet.errors import InputSpecError

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)
INPUTS = (["x:0"], [tf.TensorSpec((None, 64), tf.float32)])


class _Outputs:
    output_names = ["logits:0"]
    output_specs = [tf.TensorSpec((None, 10), tf.float32)]


#: what each road supports, as the base module's docstring lists it (hold_out: where the rows are split)
SUPPORTED = {
    ArrayDataset: {"stage", "for_ranks", "hold_out"},
    TFDataDataset: {"stage", "for_ranks", "evaluation"},
    DataFrameDataset: set(CAPABILITIES),
    RDDDataset: set(CAPABILITIES),
    ParquetDataset: set(CAPABILITIES),
    DeltaDataset: set(CAPABILITIES),
}


@pytest.mark.parametrize("adapter", list(SUPPORTED), ids=lambda c: c.__name__)
def test_each_road_says_what_it_supports_and_answers_the_drivers_checks(adapter):
    assert {c for c in CAPABILITIES if adapter.supports(c)} == SUPPORTED[adapter]
    for check in ("bind", "checked"):
        assert getattr(adapter, check) is not getattr(DataAdapter, check), f"{adapter.__name__} leaves {check} unanswered"
    assert adapter.road != DataAdapter.road


def test_hold_out_is_written_once_in_the_base():
    for adapter in (RDDDataset, DataFrameDataset, ParquetDataset, DeltaDataset, TFDataDataset):
        assert adapter.hold_out is DataAdapter.hold_out, adapter.__name__
    assert [a.holds_out for a in (ArrayDataset, RDDDataset, ParquetDataset, TFDataDataset)] == ["driver", "ranks",
                                                                                                "ranks", None]


def test_a_missing_capability_or_check_is_a_type_error_naming_the_road():
    class Rows(DataAdapter):
        road = "some rows"

    with pytest.raises(TypeError, match=r"^some rows \(Rows\) cannot train over Spark\.$"):
        Rows().stage(None, 2, 8, cleanup=None)
    with pytest.raises(TypeError, match=r"^some rows \(Rows\) cannot bind: every road of data checks its features "):
        Rows().bind(*INPUTS)
    with pytest.raises(TypeError, match=r"^some rows \(Rows\) cannot checked: every road of data checks its labels"):
        Rows().checked(SCE, _Outputs(), "raise", "the training data")
    data = TFDataDataset(tf.data.Dataset.from_tensor_slices((np.zeros((4, 64), np.float32), np.zeros(4))).batch(2))
    with pytest.raises(TypeError, match=r"^a tf.data input \(TFDataDataset\) cannot be predicted over Spark\.$"):
        data.predict_with(None, 2)
    with pytest.raises(ValueError, match="TFDataDataset has no rows to split: pass validation_data"):
        data.hold_out(None)
    with pytest.raises(ValueError, match=r"Unknown capability 'fly'"):
        DataAdapter.supports("fly")


def test_spec_types_read_as_numpy_arrays_of_the_same_rows():
    from optim.data.arrays import label_type
    from optim.data.checks import array_type

    for dtype, row in ((np.float32, (8, 8)), (np.float64, ()), (np.int32, (3,)), (np.int64, ()), (np.bool_, (2,))):
        spec = tf.TensorSpec((None, *row), tf.as_dtype(dtype))
        assert spec_type(spec) == array_type(np.zeros((2, *row), dtype))
    assert spec_type(tf.TensorSpec((None, 4), tf.string)) == array_type(np.zeros((2, 4), str)) == "array<string>"
    assert spec_type(tf.TensorSpec((None, 1), tf.int64), label=True) == label_type(np.zeros((2, 1), np.int64))
    assert spec_type(tf.TensorSpec(None, tf.float32)) == "float"  # unknown rank: no shape to check


def test_tf_data_is_checked_from_its_element_spec_without_reading_it():
    def never():
        raise AssertionError("an element was read")
        yield

    data = TFDataDataset(tf.data.Dataset.from_generator(never, output_signature=(
        tf.TensorSpec((None, 8, 8), tf.float32), tf.TensorSpec((None,), tf.int64))))
    with pytest.raises(InputSpecError, match=r"^Column 'features' has rows of shape \(8, 8\), and input 'x:0' takes rows "
                                             r"of shape \(64,\)"):
        data.bind(*INPUTS)
    strings = TFDataDataset(tf.data.Dataset.from_tensor_slices((np.zeros((4, 64), np.float32), ["a"] * 4)).batch(2))
    strings.bind(*INPUTS)
    with pytest.raises(optim.DataError, match=r"^the training data: label column 'labels' holds string values, and "
                                              r"SparseCategoricalCrossentropy"):
        strings.checked(SCE, _Outputs(), "raise", "the training data")
    unknown = TFDataDataset(tf.data.Dataset.from_generator(lambda: iter(()), output_signature=(
        tf.TensorSpec((None, None), tf.float32), tf.TensorSpec((None,), tf.int64))))
    unknown.bind(*INPUTS)  # a dimension only the rows know: nothing to refuse here
    unknown.checked(SCE, _Outputs(), "raise", "the training data")


def test_a_tf_data_function_is_checked_where_it_builds_its_dataset():
    built = []

    def per_rank(rank, size):
        built.append(rank)
        return tf.data.Dataset.from_tensor_slices((np.zeros((4, 8, 8), np.float32), np.zeros(4, np.int64))).batch(2)

    data = TFDataDataset(per_rank)
    data.bind(*INPUTS)
    checked = data.checked(SCE, _Outputs(), "raise", "the training data")
    assert built == [], "the driver does not call the function"
    import cloudpickle

    on_rank = cloudpickle.loads(cloudpickle.dumps(checked))  # as the job ships it
    with pytest.raises(InputSpecError, match=r"^Column 'features' has rows of shape \(8, 8\), and input 'x:0'"):
        on_rank.num_batches(2, rank=1, size=2)


@pytest.fixture
def parquet(tmp_path):
    folder = tmp_path / "pq"
    folder.mkdir()
    for k in range(3):
        pq.write_table(pa.table({"pixels": pa.array(np.full((4, 64), k, np.float32).tolist(), pa.list_(pa.float32())),
                                 "label": pa.array(np.arange(4) + 4 * k)}), folder / f"part-{k}.parquet")
    return str(folder)


def test_from_files_is_the_seam_for_table_formats(parquet):
    files = list_parquet(parquet)
    whole = ParquetDataset(parquet, "pixels", "label")
    schema = pq.read_schema(files[0])
    seam = ParquetDataset.from_files(parquet, files, [{}] * len(files), schema, "pixels", "label")
    assert type(seam) is ParquetDataset and seam.groups == whole.groups and seam.files == whole.files
    chosen = ParquetDataset.from_files(parquet, files[1:], [{}, {}], schema, "pixels", "label")
    labels = sorted(int(v) for _, y in chosen.batches(4, shuffle=False) for v in y)
    assert labels == list(range(4, 12)), "only the files the table chose"
    with pytest.raises(optim.ColumnError, match=r"Column 'pixel' is not among the data's columns"):
        ParquetDataset.from_files(parquet, files, [{}] * 3, schema, "pixel", "label")
    with pytest.raises(TypeError, match=r"TFDataset.from_delta"):
        DeltaDataset(parquet, "pixels", "label")


def test_delta_opens_through_the_seam(tmp_path, monkeypatch):
    deltalake = pytest.importorskip("deltalake")
    table = str(tmp_path / "delta")
    deltalake.write_deltalake(table, pa.table({"pixels": pa.array(np.zeros((6, 64), np.float32).tolist(),
                                                                   pa.list_(pa.float32())), "label": np.arange(6)}))
    calls = []
    seam = ParquetDataset.from_files.__func__

    def spy(cls, *args, **kwargs):
        calls.append(kwargs.get("absent_as_null"))
        return seam(cls, *args, **kwargs)

    monkeypatch.setattr(ParquetDataset, "from_files", classmethod(spy))
    data = optim.TFDataset.from_delta(table, "pixels", "label")
    assert type(data) is DeltaDataset and data.version == 0 and data.num_rows == 6 and calls == [True]
    assert data.hold_out(None)[0].version == 0
