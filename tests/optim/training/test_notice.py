"""The ranks' side of a decommission notice (optim.training.notice) in one process: train() stops at the step of
the notice with a checkpoint there (no periodic checkpoint asked for), and a run resumed from it ends with the
weights of a run never stopped, bit for bit; the question is asked about once a second, not at every step."""

import numpy as np

import optim
from optim.config import TrainConfig
from optim.data.arrays import ArrayDataset
from optim.training.collective import LocalCollective
from optim.training.loop import train
from optim.training.notice import StepNotice
from optim.training.reporting import Reporter
from tests import digits
from tfnet import TFNet

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def _net():
    return TFNet.from_keras(digits.cnn(classes=10, seed=0))


def test_a_notice_stops_at_that_step_with_a_checkpoint_and_the_resume_ends_as_a_run_never_stopped(tmp_path,
                                                                                               monkeypatch):
    import optim.training.notice as N

    monkeypatch.setattr(N, "NOTICE_EVERY_S", 0.0)  # ask at every step, so that the notice's step is known here
    x, y = digits.load()
    x, y = x[:256], y[:256]  # 8 steps per epoch
    config = TrainConfig(epochs=3, batch_size=32, model_dir=str(tmp_path / "a"), run_id="20261201-000000-000000-aaaa",
                         seed=3)
    whole = _net()
    train(whole, SCE, optim.Adam(0.01), [], ArrayDataset.from_tensors((x, y)), config)

    at = [0]

    class Steps(Reporter):
        def step(self, step, epoch, logs):
            at[0] = step

    stopped_config = TrainConfig(**{**config.__dict__, "model_dir": str(tmp_path / "b"),
                                    "run_id": "20261201-000000-000000-bbbb"})
    net = _net()
    first = train(net, SCE, optim.Adam(0.01), [], ArrayDataset.from_tensors((x, y)), stopped_config,
                  reporter=Steps(), notice_check=lambda: at[0] >= 11)  # the notice comes at step 11 (epoch 2)
    assert first.stopped and first.step == 11, (first.stopped, first.step)
    ckpts = sorted(p.name for p in (tmp_path / "b" / "checkpoints" / stopped_config.run_id).glob("ckpt-*.npz"))
    assert ckpts == ["ckpt-000000008.npz", "ckpt-000000011.npz"], ckpts  # epoch 1's end, and the notice's step
    again = TrainConfig(**{**stopped_config.__dict__, "resume": True})
    resumed = _net()
    second = train(resumed, SCE, optim.Adam(0.01), [], ArrayDataset.from_tensors((x, y)), again)
    assert second.start_step == 11 and second.step == 24 and not second.stopped
    assert len(second.history["loss"]) == 3
    for name, want in whole.get_weights().items():
        np.testing.assert_array_equal(resumed.get_weights()[name], want, err_msg=name)


def test_the_question_is_asked_about_once_a_second_whatever_the_step_time(monkeypatch):
    import optim.training.notice as N

    clock = [0.0]
    monkeypatch.setattr(N.time, "perf_counter", lambda: clock[0])
    asked = []
    notice = StepNotice(lambda: asked.append(clock[0]) or False, LocalCollective(), start_step=0, every_s=1.0)
    for step in range(1, 2001):
        clock[0] += 0.01  # 10 ms steps: about every 100th step asks, after the first
        assert notice.due(step) is False
    assert 19 <= len(asked) <= 22, len(asked)
    later = np.diff(asked[2:])
    assert np.all(np.abs(later - 1.0) < 0.02), later
    assert StepNotice(None, LocalCollective(), 0).due(1) is False  # no check: never due, no collective
