"""docs/benchmarks.md's figures by topic are generated from the JSON the benchmarks wrote (benchmarks/report.py):
the committed block is what the committed JSON gives, a changed figure changes the table, the ratio and the bar
drawn, and a missing file or figure is an error that names it."""

import importlib.util
import json
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")


def _report():
    spec = importlib.util.spec_from_file_location("bench_report", os.path.join(ROOT, "benchmarks", "report.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def docs_copy(tmp_path):
    for name in os.listdir(DOCS):
        if name.endswith(".json") or name == "benchmarks.md":
            shutil.copy(os.path.join(DOCS, name), tmp_path / name)
    return tmp_path


def test_the_committed_figures_by_topic_are_what_the_committed_json_gives(capsys):
    report = _report()
    assert report.main(["--check"]) == 0, capsys.readouterr().err
    block, topics = report.render()
    with open(os.path.join(DOCS, "benchmarks.md")) as f:
        assert block in f.read()
    for t in topics:  # every topic's plot is committed beside it
        assert os.path.getsize(os.path.join(DOCS, "plots", f"{t.slug}.png")) > 0, t.slug


def test_a_changed_figure_changes_the_table_the_ratio_and_the_bar(docs_copy, capsys):
    report = _report()
    path = docs_copy / "bench_precision.json"
    results = json.loads(path.read_text())
    keras_fp32 = results["train"]["img_s"]["keras_fp32"]
    results["train"]["img_s"]["tfnet_bf16"] = 123.0
    path.write_text(json.dumps(results))
    assert report.main(["--check", "--docs", str(docs_copy)]) == 1
    assert "differ from the JSON" in capsys.readouterr().err
    assert report.main(["--docs", str(docs_copy)]) == 0
    markdown = (docs_copy / "benchmarks.md").read_text()
    assert f"| tfnet bf16 | 123.0 img/s | {123.0 / keras_fp32:.2f} |" in markdown
    assert markdown.count(report.START) == markdown.count(report.END) == 1
    assert report.main(["--check", "--docs", str(docs_copy)]) == 0
    training = next(t for t in report.render(str(docs_copy))[1] if t.slug == "training")
    drawn = report.plot(training, str(docs_copy / "training.png"))
    assert drawn == [f.value for f in training.figures] and 123.0 in drawn
    assert (docs_copy / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_file_or_figure_is_an_error_naming_it(docs_copy, capsys):
    report = _report()
    path = docs_copy / "bench_startup.json"
    results = json.loads(path.read_text())
    del results["tfnet_warm_s"]
    path.write_text(json.dumps(results))
    with pytest.raises(report.ReportError, match=r"^bench_startup.json has no tfnet_warm_s$"):
        report.render(str(docs_copy))
    path.unlink()
    with pytest.raises(report.ReportError, match=r"bench_startup.json is missing: run the benchmark that writes it"):
        report.render(str(docs_copy))
    before = (docs_copy / "benchmarks.md").read_text()
    assert report.main(["--docs", str(docs_copy)]) == 2
    assert "bench_startup.json is missing" in capsys.readouterr().err
    assert (docs_copy / "benchmarks.md").read_text() == before, "nothing written on an error"


def test_each_kind_of_cpu_gets_a_column_of_the_topics_it_ran(docs_copy, capsys):
    """``docs/bench/<kind>/``: the same benchmarks on another kind of CPU, a column beside the first in each topic it
    has all the figures of; a kind that ran part of a benchmark adds nothing to the topics it lacks."""
    report = _report()
    assert report.kind_of({"cpu": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
                           "flags": ["amx_bf16", "amx_tile", "avx2", "avx512_bf16", "avx512f"]}) == "intel-xeon-amx"
    assert report.kind_of({"cpu": "AMD EPYC 9B14", "flags": ["avx2", "avx512_bf16", "avx512f"]}) == \
        "amd-epyc-avx512-bf16"
    assert report.kind_of({"cpu": "AMD EPYC 7B13", "flags": ["avx2", "fma"]}) == "amd-epyc-avx2"
    # with the family and model numbers (tfnet.precision.cpu_model): Zen 4 and Zen 5 share their flags
    avx512 = ["avx2", "avx512_bf16", "avx512f"]
    assert [report.kind_of({"cpu": f"AMD EPYC (family {f} model {m})", "flags": flags}) for f, m, flags in
            [(25, 1, ["avx2"]), (25, 17, avx512), (25, 160, avx512), (26, 2, avx512), (26, 17, avx512)]] == \
        ["amd-epyc-zen3-avx2", "amd-epyc-zen4-avx512-bf16", "amd-epyc-zen4-avx512-bf16",
         "amd-epyc-zen5-avx512-bf16", "amd-epyc-zen5-avx512-bf16"]
    amx = json.loads((docs_copy / "bench_precision.json").read_text())
    amx["machine"] = {"cpu": "Intel Xeon", "flags": ["amx_tile", "avx512_bf16", "avx512f"], "cores": 2, "onednn": "1",
                      "date": "2026-11-28"}
    amx["train"]["img_s"]["tfnet_bf16"] = 77.0
    del amx["spark"]  # --only train: no inference figures from this kind
    (docs_copy / "bench" / "intel-xeon-amx").mkdir(parents=True)
    (docs_copy / "bench" / "intel-xeon-amx" / "bench_precision.json").write_text(json.dumps(amx))
    assert report.main(["--check", "--docs", str(docs_copy)]) == 1
    capsys.readouterr()
    assert report.main(["--docs", str(docs_copy)]) == 0
    markdown = (docs_copy / "benchmarks.md").read_text()
    keras_fp32 = amx["train"]["img_s"]["keras_fp32"]
    assert "| | amd-epyc-avx512-bf16 | ratio | intel-xeon-amx | ratio |" in markdown
    assert f"| 77.0 img/s | {77.0 / keras_fp32:.2f} |" in markdown
    assert "Source: `docs/bench/intel-xeon-amx/bench_precision.json` (Intel Xeon, 2 cores; amx_tile" in markdown
    topics = {t.slug: t for t in report.render(str(docs_copy))[1]}
    assert [k for k, _, _ in topics["training"].columns] == ["intel-xeon-amx"]
    assert topics["inference"].columns == []  # that kind has no inference figures: one column, as before
    drawn = report.plot(topics["training"], str(docs_copy / "training.png"))
    assert drawn == [f.value for f in topics["training"].figures]


def test_a_kind_measured_again_beside_the_first_columns_figures_names_each_columns_date(docs_copy):
    """The first column's figures and a folder's of the same kind of CPU (the same machine a week later): two columns
    with one name would not say which is which, so each names its run's date; a kind met once keeps its bare name."""
    report = _report()
    again = json.loads((docs_copy / "bench_precision.json").read_text())
    first_date = again["machine"]["date"]
    again["machine"]["date"] = "2026-12-05"
    again["train"]["img_s"]["tfnet_bf16"] = 66.0
    kind = report.kind_of(again["machine"])
    (docs_copy / "bench" / kind).mkdir(parents=True)
    (docs_copy / "bench" / kind / "bench_precision.json").write_text(json.dumps(again))
    amx = dict(again, machine={"cpu": "Intel Xeon", "flags": ["amx_tile", "avx512_bf16", "avx512f"], "cores": 2,
                               "onednn": "1", "date": "2026-11-28"})
    (docs_copy / "bench" / "intel-xeon-amx").mkdir(parents=True)
    (docs_copy / "bench" / "intel-xeon-amx" / "bench_precision.json").write_text(json.dumps(amx))
    assert report.main(["--docs", str(docs_copy)]) == 0
    markdown = (docs_copy / "benchmarks.md").read_text()
    assert (f"| | {kind} ({first_date}) | ratio | {kind} (2026-12-05) | ratio | intel-xeon-amx | ratio |"
            in markdown), [line for line in markdown.splitlines() if line.startswith("| | ")]
    assert "| 66.0 img/s |" in markdown


def test_a_cpu_without_native_bf16_says_what_its_bf16_rows_ran(docs_copy):
    """On a Zen 3 (no bf16) Keras emulates bf16 and tfnet's bf16 runs fp32: the topics say so, where the record
    says so, and say nothing of it for a CPU with bf16 (or a record from before the keys were kept)."""
    report = _report()
    path = docs_copy / "bench_precision.json"
    results = json.loads(path.read_text())

    def notes() -> str:
        topics = {t.slug: t for t in report.render(str(docs_copy))[1]}
        return " ".join(topics["training"].notes + topics["inference"].notes)

    assert "no native bf16" not in notes()
    results["ceilings"]["bf16_native"] = False
    results["train"]["bf16_step_precision"] = "fp32"
    results["local"]["precision"] = {"tensorflow_bf16": "fp32", "openvino_bf16": "fp32", "openvino_int8": "int8"}
    path.write_text(json.dumps(results))
    said = notes()
    assert "tfnet's bf16 step ran fp32" in said
    assert "tensorflow_bf16 and openvino_bf16 ran fp32" in said
