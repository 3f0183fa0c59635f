"""`make run`'s main job, shortened, on the test session's local[2] Spark: pretrain, freeze,
distributed fine-tuning on 2 ranks, evaluation, TFPredictor on a DataFrame, save."""

import os

import pytest

from examples import main_job

pytestmark = pytest.mark.spark


def test_main_job_end_to_end(spark, tmp_path, capsys):
    summary = main_job.main(["--out", str(tmp_path), "--pretrain-epochs", "4", "--epochs", "3", "--quiet"])
    out = capsys.readouterr().out
    for k in range(1, 7):
        assert f"[{k}/6]" in out
    assert "Summary" in out
    assert summary["ranks"] == 2
    assert summary["accuracy after fine-tuning"] > max(0.8, summary["accuracy before fine-tuning (new head)"])
    assert summary["TFPredictor accuracy (DataFrame)"] == pytest.approx(summary["accuracy after fine-tuning"], abs=1e-6)
    # fp32 and INT8 throughputs measured alike: both on a warm second pass, and said so
    assert summary["TFPredictor rows/s (warm: a second pass)"] > 0
    assert "fp32 / INT8 accuracy, rows/s warm (DataFrame)" in summary
    assert "first pass" in out and "warm" in out
    assert os.path.exists(tmp_path / "pretrained_digits.pb")
    assert os.path.exists(tmp_path / "fine_tuned" / "frozen_inference_graph.pb")
    assert spark.sparkContext._jsc is not None  # the shared session is left running


def test_resnet50_option_keeps_user_arguments(monkeypatch):
    seen = {}
    monkeypatch.setattr("examples.resnet50.train.main", lambda argv: seen.setdefault("argv", argv))
    main_job.main(["--resnet50", "--batch-size", "4", "--data-format", "jpeg", "--data-dir", "/x"])
    argv = seen["argv"]
    assert argv[:6] == ["--batch-size", "4", "--data-format", "jpeg", "--data-dir", "/x"]
    assert "--synthetic" not in argv and argv.count("--batch-size") == 1
    assert argv[argv.index("--num-workers") + 1] == "2" and "--scaling" in argv
