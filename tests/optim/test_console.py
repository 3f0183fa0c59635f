"""What a new user's console shows, without Spark: each tfnet line once whatever logging the program
configured (the logging HOWTO's library conventions), Keras's ``verbose`` ("auto": a bar in a terminal,
one line per epoch elsewhere, no ``\\r`` in a log file), the Keras-style history ``optimize`` returns,
and Ctrl-C at a public call. The programs run as processes of their own, as a user runs them (a real
pseudo-terminal where a terminal is meant)."""

import collections
import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TRAIN = textwrap.dedent("""
    import sys
    from tfnet import TFNet
    import optim
    from optim import TFOptimizer
    from tests import digits

    x, y = digits.load()
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)),
                      optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.05),
                      metrics=["accuracy"], model_dir=sys.argv[1])
""")


def run(code: str, *args: str, terminal: bool = False) -> tuple[int, str]:
    """Runs ``code`` in a fresh interpreter from the repository root: ``(exit status, everything it
    printed, stdout and stderr together)``; on a pseudo-terminal of 24x100 with ``terminal``, else
    into pipes (as into a log file)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("TFNET_VERBOSE", None)
    cmd = [sys.executable, "-c", code, *args]
    if not terminal:
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=300)
        return done.returncode, done.stdout.decode()
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the other side closed: the process ended
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.wait(timeout=300), out.decode(errors="replace")


@pytest.mark.parametrize("order", ["basicConfig first", "configure first"])
def test_each_tfnet_line_prints_once_whatever_logging_the_program_configured(order, tmp_path):
    """``logging.basicConfig(level=INFO)`` and ``optim.logs.configure(1)`` in one program (before the
    fix every tfnet line printed twice: once by tfnet's handler, once by the root's)."""
    first, second = ("logging.basicConfig(level=logging.INFO)", "optim.logs.configure(1)")
    if order == "configure first":
        first, second = second, first
    code = "import logging\nimport optim.logs\n" + first + "\n" + second + "\n" + TRAIN + textwrap.dedent("""
        opt.optimize((x[:64], y[:64]), epochs=1, batch_size=32, verbose=0, resume=True)  # a warning: no run yet
        opt.optimize((x[:64], y[:64]), epochs=2, batch_size=32, verbose=0, resume=True)  # info: resumes that run
        print("DONE")
    """)
    status, out = run(code, str(tmp_path / "run"))
    assert status == 0 and "DONE" in out, out[-3000:]
    assert "a fresh start (resume=True" in out and "resumes from run" in out, out[-3000:]  # warning, info lines
    counts = collections.Counter(line.split(":")[-1] if line.startswith(("INFO:", "WARNING:")) else line
                                 for line in out.splitlines() if line.strip())
    assert [line for line, n in counts.items() if n > 1] == [], out[-3000:]


def test_verbose_auto_draws_a_bar_in_a_terminal_and_one_line_per_epoch_in_a_log(tmp_path):
    """Keras's ``verbose="auto"``: a progress bar in a terminal; written to a file or a pipe, one line per
    epoch and no ``\\r`` redraws (before: 4-5 redraws per epoch line, about 700 characters)."""
    code = TRAIN + textwrap.dedent("""
        history = opt.optimize((x[:256], y[:256]), epochs=3, batch_size=32, verbose="auto")
        print("HISTORY", history.epoch, history.history["loss"] == history["loss"], "loss" in history)
    """)
    status, logged = run(code, str(tmp_path / "log"))
    assert status == 0, logged[-3000:]
    assert "\r" not in logged, repr(logged[-2000:])
    epochs = [line for line in logged.splitlines() if line.startswith("epoch ")]
    assert [line.split(" (")[0] for line in epochs] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"], logged[-2000:]
    assert all("loss=" in line and "accuracy=" in line for line in epochs)
    assert "HISTORY [0, 1, 2] True True" in logged
    status, shown = run(code, str(tmp_path / "tty"), terminal=True)
    assert status == 0, shown[-3000:]
    assert "step/s" in shown and "\repoch 3/3" in shown, repr(shown[-2000:])  # tqdm's bar, redrawn in place


def test_optimize_returns_a_keras_history_that_is_also_the_dict_it_was():
    import optim
    from optim import TFOptimizer
    from tests import digits
    from tfnet import TFNet

    x, y = digits.load()
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)),
                      optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.05),
                      metrics=["accuracy"])
    history = opt.optimize((x[:128], y[:128]), epochs=2, batch_size=32, validation_data=(x[-64:], y[-64:]),
                           verbose=0)
    assert isinstance(history, optim.History) and isinstance(history, dict)
    assert history.epoch == [0, 1]
    assert sorted(history.history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert history.history["loss"] is history["loss"] and len(history["val_loss"]) == 2
    assert history.params == {"epochs": 2, "verbose": 0}
    assert json.loads(json.dumps(history)) == {k: list(v) for k, v in history.items()}
    with pytest.raises(ValueError, match="verbose.*Received: verbose=3"):
        opt.optimize((x[:64], y[:64]), epochs=1, verbose=3)


def test_no_epoch_line_once_a_call_stops_on_ctrl_c():
    """Once a Ctrl-C has the call stopping (:func:`optim.training.interrupts.stopping`), the progress printer prints
    no more epoch lines, though rank 0 reports on until its task is killed: after the Ctrl-C, the user's console gets
    the short traceback only."""
    import io

    from optim.training import interrupts
    from optim.training.reporting import ProgressBar

    out = io.StringIO()
    bar = ProgressBar(verbose=2, file=out)
    bar.begin(epochs=3, steps_per_epoch=2, initial_step=0, initial_epoch=0)
    bar.step(1, 0, {"loss": 1.0, "samples_per_sec": 10.0})
    bar.epoch_end(0, 2, {"loss": 1.0})
    interrupts._STOPPING.set()  # what the first Ctrl-C inside Interruptible sets
    try:
        bar.step(3, 1, {"loss": 0.5, "samples_per_sec": 10.0})
        bar.epoch_end(1, 4, {"loss": 0.5})
    finally:
        interrupts._STOPPING.clear()
    assert out.getvalue().splitlines() == ["epoch 1/3 (step 2): loss=1, samples_per_sec=10"], out.getvalue()


def test_a_second_ctrl_c_while_a_call_stops_is_ignored():
    """The first Ctrl-C goes to the process's handler (Python's: ``KeyboardInterrupt``); one more while
    the call winds down changes nothing; the handler is back afterwards. In a program of its own, as a
    user's Ctrl-C reaches one (a real SIGINT in the test process would also reach the handler that the
    suite's SparkContext installed there)."""
    status, shown = run(textwrap.dedent("""
        import signal
        from optim.training.interrupts import Interruptible

        before = signal.getsignal(signal.SIGINT)
        stopped = []
        try:
            with Interruptible():
                try:
                    signal.raise_signal(signal.SIGINT)
                except KeyboardInterrupt:
                    signal.raise_signal(signal.SIGINT)  # the second, while stopping: ignored
                    stopped.append(True)
                    raise
        except KeyboardInterrupt:
            stopped.append("raised")
        print("RESULT", stopped, signal.getsignal(signal.SIGINT) is before)
    """))
    assert status == 0, shown[-3000:]
    assert "RESULT [True, 'raised'] True" in shown, shown[-3000:]


def test_a_ctrl_c_held_for_a_py4j_call_is_raised_when_it_returns_or_after_hold_s_at_most():
    """A Ctrl-C that lands while the main thread waits in a Py4J call is held until the call returns (then raised
    in the caller's code), and no longer than ``HOLD_S``: a JVM that never answers cannot swallow it. The call
    stands in for Py4J's by its module's name (what :func:`~optim.training.interrupts._in_py4j` looks at), in a
    program of its own, as in the test above."""
    status, shown = run(textwrap.dedent("""
        import signal, sys, threading, time, types
        from optim.training import interrupts
        from optim.training.interrupts import Interruptible

        fake = types.ModuleType("py4j.java_gateway_stand_in")  # a call that answers after `seconds`
        exec("import time\\n"
             "def call(seconds, log):\\n"
             "    start = time.monotonic()\\n"
             "    while time.monotonic() - start < seconds:\\n"
             "        time.sleep(0.01)\\n"
             "    log.append('answered')\\n", fake.__dict__)

        def ctrl_c_in(seconds):
            threading.Timer(seconds, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()

        def case(answer_s, hold_s):
            interrupts.HOLD_S = hold_s
            log, start = [], time.monotonic()
            try:
                with Interruptible():
                    ctrl_c_in(0.1)
                    fake.call(answer_s, log)
                    log.append('caller')
                    time.sleep(answer_s + hold_s + 30)  # the held Ctrl-C ends this sleep
                    log.append('slept')
            except KeyboardInterrupt:
                return log, time.monotonic() - start
            return log, None

        log, took = case(answer_s=0.6, hold_s=30.0)
        print("ANSWERED", log, took is not None and took >= 0.6 and took < 30)
        log, took = case(answer_s=60.0, hold_s=0.5)
        print("NEVER", log, took is not None and took >= 0.6 and took < 60)
    """))
    assert status == 0, shown[-3000:]
    # held until the call answered, then raised in the caller's code (its sleep), not lost and not inside the call
    assert "ANSWERED ['answered', 'caller'] True" in shown, shown[-3000:]
    # a call that never answers: raised inside it once HOLD_S had passed since the Ctrl-C (0.1 s in)
    assert "NEVER [] True" in shown, shown[-3000:]
