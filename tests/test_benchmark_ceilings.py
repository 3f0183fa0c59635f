"""Every benchmark ends with benchmarks/common.py's finish(): the machine and its matmul ceilings (TensorFlow's fp32
and bf16, OpenVINO's fp32 and INT8) beside its figures, and in its JSON (issue 57). The ceilings are measured in a
fresh interpreter here, as a benchmark measures them."""

import json
import os

from tests.benchmark_files import BENCHMARKS, load


def _common():
    return load("common")


def test_finish_prints_and_keeps_the_ceilings_it_measured(tmp_path, capsys):
    common = _common()
    out = common.finish(str(tmp_path / "b.json"), {"figure": 1.5})
    printed = capsys.readouterr().out.splitlines()
    written = json.loads((tmp_path / "b.json").read_text())
    assert written["figure"] == 1.5 and written["ceilings"] == out["ceilings"]
    tf_c, ov_c = written["ceilings"], written["openvino_ceilings"]
    assert tf_c["fp32_gflops"] > 1 and (tf_c["bf16_gflops"] > 0 if "bf16_not_measured" not in tf_c
                                        else common._bf16_capped()), tf_c
    assert ov_c["fp32_gops"] > 1 and ov_c["int8_gops"] > 1, ov_c
    assert printed[-2] == common.ceilings_line(tf_c) and printed[-1] == common.openvino_ceilings_line(ov_c)
    assert printed[-3].startswith("# ") and common.machine()["cpu"] in printed[-3]


def test_finish_keeps_what_the_benchmark_measured_itself(capsys, monkeypatch):
    common = _common()
    monkeypatch.setattr(common, "measure_ceilings", lambda: (_ for _ in ()).throw(AssertionError("measured again")))
    tf_c = {"n": 8, "fp32_gflops": 100.0, "bf16_gflops": 400.0, "bf16_native": True, "amx": True}
    ov_c = {"n": 8, "threads": 2, "fp32_gops": 90.0, "int8_gops": 360.0, "int8_vs_fp32": 4.0}
    out = common.finish(None, {"ceilings": tf_c, "openvino_ceilings": ov_c})
    assert out["ceilings"] is tf_c and out["openvino_ceilings"] is ov_c
    assert "bf16 400 GFLOP/s (AMX; 4.00x fp32)" in capsys.readouterr().out


def test_a_ceiling_that_cannot_be_measured_says_why(capsys, monkeypatch):
    common = _common()
    monkeypatch.setattr(common, "measure_ceilings", lambda: {"error": "ModuleNotFoundError: No module named 'x'"})
    common.finish(None, {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == ["# ceilings: TF not measured (ModuleNotFoundError: No module named 'x')",
                          "# ceilings: OpenVINO INT8 not measured (ModuleNotFoundError: No module named 'x')"]


def test_every_benchmark_ends_with_finish():
    scripts = sorted(f for f in os.listdir(BENCHMARKS) if f.startswith("bench_") and f.endswith(".py"))
    missing = [f for f in scripts if "finish(" not in open(os.path.join(BENCHMARKS, f)).read()]
    assert len(scripts) > 20 and missing == [], missing



def test_openvinos_fp32_ceiling_runs_in_fp32_where_the_cpu_has_bf16():
    """Left to its default precision hint, OpenVINO's CPU plugin runs an fp32 model in bf16 on a CPU with bf16 (AMX,
    avx512_bf16): the "fp32" ceiling was a bf16 one there (830 GOP/s against TF's 225 GFLOP/s fp32 on an AMX Xeon),
    and INT8's ratio to it was INT8 against bf16. The plugin's own answer says what ran."""
    common = _common()
    c = common.openvino_matmul_ceilings(n=64, threads=1, rounds=1)
    bf16 = "bf16" if set(common.machine()["flags"]) & {"avx512_bf16", "amx_bf16"} else "f32"
    if common._bf16_capped():  # ONEDNN_MAX_CPU_ISA below bf16 on a CPU with it: the plugin refuses the hint
        assert c["precisions"] == {"fp32": "f32", "int8": "f32"} and "bf16" not in common.openvino_ceilings_line(c)
        return
    assert c["precisions"] == {"fp32": "f32", "bf16": bf16, "int8": "f32"}, c
    assert c["bf16_gops"] > 0 and c["bf16_vs_fp32"] == c["bf16_gops"] / c["fp32_gops"]
    assert "bf16" in common.openvino_ceilings_line(c)
