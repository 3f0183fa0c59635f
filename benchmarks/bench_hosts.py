"""Scaling over hosts that are not one machine (issue 31): a communication-heavy net (an MLP of 25.2M
parameters, 1024-4096-4096-1024-10, on small batches) on 4 ranks against 1 rank, each rank a Spark
worker of one core in a network namespace of its own (tests/netns.py, tests/netns_cluster.py: its own
address, loopback and /tmp; links shaped to ``--rates`` with ``--delay-ms`` one way between hosts),
the driver and the master on the network's root host. For each link rate and each sync mode
(``optimize(sync=...)``: every step with one allreduce after the backward pass, every step with
bucketed overlap (the default), local SGD K=16, asynchronous), with Horovod's threads at idle priority
(tfnet's default) and at normal priority (``TFNET_HOROVOD_THREADS=normal``). Efficiency =
throughput(4) / (4 x throughput(1)), the same per-rank batch; a mode's throughput is its mean step
over whole exchange cycles after the warm-up (bench_scaling.py's rule). Also the exposed allreduce
share of a step and the megabytes each rank sends per step.

The machine has 2 cores, so 4 ranks of 1 thread share them: the machine's own ceiling for 4 processes
is measured too (the same MLP step in plain TensorFlow, 1 thread, 4 processes at once against 1
alone), and each efficiency is printed against perfect scaling and against that ceiling. What the
links give one TCP connection (round trip, stream rate) is measured before each rate's runs; where
the kernel has no netem the delay is added by a process at the switch (tests/netns_delay.py), whose
CPU time is printed at the end.

Then the cost of elastic training: 4 ranks wanted, at least 2 (``min_workers=2``), ``model_dir`` on an
S3 server (moto) on the root host; one worker's host is killed after the first checkpoint and comes
back once the smaller run steps. Printed: seconds from the kill to the first step on fewer ranks
(and its parts: the failure seen, ``elastic_wait``, the new stage), and from the worker's return to the
first step on 4 ranks (the slots seen, the stop at the epoch boundary, the new stage).

Needs root (network namespaces) and Horovod built by scripts/build_horovod.sh (tfnet's patch lets
Gloo listen on each host's own address).

    python benchmarks/bench_hosts.py [--rates 1gbit 10gbit] [--delay-ms 0.2] [--steps 8] [--modes overlap local]
                                     [--normal-modes overlap local] [--rounds 1] [--no-ceiling] [--no-elastic]
                                     [--elastic-epochs 14] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import banner, finish, machine, setup_env

WIDTHS = (1024, 4096, 4096, 1024, 10)

CEILING = """
import os, sys, time
os.environ["TF_ENABLE_ONEDNN_OPTS"] = sys.argv[1]
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import keras
b, steps, widths = int(sys.argv[2]), int(sys.argv[3]), [int(w) for w in sys.argv[4].split(",")]
model = keras.Sequential([keras.Input((widths[0],))] + [keras.layers.Dense(w, activation="relu") for w in widths[1:-1]]
                         + [keras.layers.Dense(widths[-1])])
opt = keras.optimizers.SGD(1e-3, momentum=0.9)
x = tf.random.uniform((b, widths[0]), -1, 1)
y = tf.random.uniform((b,), 0, widths[-1], tf.int64)
@tf.function
def step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss
step().numpy(); step().numpy()
times = []
for _ in range(steps):
    t = time.perf_counter(); step().numpy(); times.append(time.perf_counter() - t)
times.sort()
print(b / times[len(times) // 2])
"""


def mlp(seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    layers = [keras.layers.Dense(w, activation="relu", name=f"dense{i}") for i, w in enumerate(WIDTHS[1:-1])]
    return keras.Sequential([keras.Input((WIDTHS[0],), name="x"), *layers, keras.layers.Dense(WIDTHS[-1], name="logits")],
                            name="mlp25m")


def machine_ceiling(onednn: int, b: int, steps: int, n: int) -> dict:
    """Plain-TF 1-thread training throughput of the MLP: one process alone, then ``n`` at once."""
    cmd = [sys.executable, "-c", CEILING, str(onednn), str(b), str(steps), ",".join(map(str, WIDTHS))]

    def run(k):
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for _ in range(k)]
        return [float(p.communicate(timeout=900)[0].strip().splitlines()[-1]) for p in procs]

    alone = run(1)[0]
    together = run(n)
    return {"alone": alone, "together": together, "ceiling": sum(together) / (n * alone)}


class Timeline:
    """When the driver saw what: rank 0's progress events (``EventSink.dispatch``, patched for the
    benchmark) and tfnet's warnings (an attempt failed, the run goes on with N ranks, slots are back)."""

    def __init__(self):
        import warnings

        from optim.transport import progress

        self.events: list[tuple[float, dict]] = []
        self.warnings: list[tuple[float, str]] = []
        original = progress.EventSink.dispatch
        timeline = self

        def dispatch(sink, event):
            timeline.events.append((time.monotonic(), event))
            return original(sink, event)

        progress.EventSink.dispatch = dispatch
        shown = warnings.showwarning

        def showwarning(message, *args, **kwargs):
            timeline.warnings.append((time.monotonic(), str(message)))
            return shown(message, *args, **kwargs)

        warnings.showwarning = showwarning
        warnings.simplefilter("always", RuntimeWarning)  # the same warning twice (shrink, grow) is shown twice

    def first(self, after: float, what: str, contains: str = "") -> float | None:
        """The time of the first event of kind ``what`` (or warning containing ``contains`` when
        ``what`` is ``"warning"``) after ``after``."""
        if what == "warning":
            return next((t for t, m in self.warnings if t > after and contains in m), None)
        return next((t for t, e in self.events if t > after and e.get("event") == what), None)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"])
    p.add_argument("--delay-ms", type=float, default=0.2, help="one way, between two hosts")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--per-rank-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=8, help="steps per run; the first 2 (or the first cycle) are warm-up")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--onednn", type=int, default=1)
    p.add_argument("--modes", nargs="*", default=None,
                   help="run only the modes whose names contain one of these words (one, overlap, local, async)")
    p.add_argument("--normal-modes", nargs="*", default=["overlap", "local"],
                   help="the modes also run with Horovod's threads at normal priority (words as --modes)")
    p.add_argument("--no-ceiling", action="store_true")
    p.add_argument("--no-elastic", action="store_true")
    p.add_argument("--elastic-epochs", type=int, default=14)
    p.add_argument("--elastic-wait", type=float, default=5.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(bool(args.onednn))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from tests.netns import Network
    from tests.netns_cluster import NetnsCluster

    print(banner(), flush=True)
    print(f"# load average before: {os.getloadavg()[0]:.1f} (other processes share these cores)", flush=True)
    out: dict = {"machine": machine(), "args": vars(args), "links": {}, "runs": {}, "modes": {},
                 "load_before": os.getloadavg()[0]}
    with Network(hosts=args.ranks, rate=args.rates[0], delay_ms=args.delay_ms, services=True) as net:
        print(f"# {args.ranks} hosts on {net.subnet}, links shaped by {net.shaping}, {args.delay_ms} ms one way",
              flush=True)
        os.environ["SPARK_LOCAL_IP"] = net.root.address
        with NetnsCluster(net, cores=1, memory="3g") as cluster:
            timeline = Timeline()
            spark = _session(cluster, net, args.onednn)
            _scaling(spark, net, args, out)
            if not args.no_elastic:
                out["elastic"] = _elastic(spark, cluster, net, args, timeline)
            spark.stop()
        out["delay_process"] = None
    out["delay_process"] = net.delay_stats
    if not args.no_ceiling:
        out["ceiling"] = machine_ceiling(args.onednn, args.per_rank_batch, max(6, args.steps), args.ranks)
    out["load_after"] = os.getloadavg()[0]
    _report(out, args)
    print(f"# load average after: {out['load_after']:.1f}")
    finish(args.json, out)
    return out


def _session(cluster, net, onednn: int):
    from optim.spark.session import build_session
    from optim.spark.warm_up import ensure_warm_up

    spark = build_session("tfnet-bench-hosts", cluster.url, {
        "spark.ui.enabled": "false", "spark.driver.host": net.root.address,
        "spark.driver.bindAddress": net.root.address, "spark.driver.memory": "4g",
        "spark.driver.maxResultSize": "2g", "spark.executor.memory": "2g", "spark.executor.cores": "1",
        "spark.task.cpus": "1", "spark.executorEnv.TF_ENABLE_ONEDNN_OPTS": str(onednn),
        "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": "2"})
    warm = ensure_warm_up(spark)
    if warm is not None:
        warm.wait(900)
    return spark


def _modes(args):
    import optim

    modes = {
        "every step, one call after the backward pass": optim.EveryStep(overlap=False),
        "every step, bucketed overlap (default)": None,
        "local SGD K=16": optim.LocalSGD(every=16),
        "async (staleness 1)": optim.Asynchronous(staleness=1),
    }
    keys = {"one": "one call", "overlap": "overlap", "local": "local", "async": "async"}

    def chosen(words, name):
        return any(keys.get(w, w) in name for w in words)

    runs = []
    for name, sync in modes.items():
        if args.modes and not chosen(args.modes, name):
            continue
        runs.append((name, sync, "idle"))
        if chosen(args.normal_modes or [], name):
            runs.append((name, sync, "normal"))
    return runs


def _run(ranks: int, sync, threads: str, args) -> dict:
    """One ``optimize()`` of the MLP on ``ranks`` ranks: throughput over whole exchange cycles after the
    warm-up (2 steps, or the first cycle of local SGD)."""
    import numpy as np
    import tensorflow as tf

    import optim
    from optim import TFDataset, TFOptimizer
    from tfnet import TFNet

    os.environ["TFNET_HOROVOD_THREADS"] = threads
    b = args.per_rank_batch
    every = getattr(sync, "every", 1)
    warm = max(2, every)
    steady = -(-max(args.steps - 2, every) // every) * every

    def data(rank, size):
        rng = np.random.default_rng(rank)
        x = rng.uniform(-1, 1, (b, WIDTHS[0])).astype("float32")
        y = rng.integers(0, WIDTHS[-1], b).astype("int64")
        return tf.data.Dataset.from_tensors((x, y)).repeat(warm + steady)

    opt = TFOptimizer(TFNet.from_keras(mlp()), optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optim.SGD(1e-3, momentum=0.9))
    t0 = time.monotonic()
    history = opt.optimize(TFDataset.from_tf_data(data), epochs=1, num_workers=ranks, verbose=0, timeout=900,
                           startup_timeout=900, sync=sync)
    times = [t for t in opt.last_run["step_times"] if t][warm:]
    comm = [c for c in opt.last_run["allreduce_seconds"] if c is not None][warm:]
    step = sum(times) / len(times)
    return {"samples_s": ranks * b / step, "step_s": step, "steps": len(times),
            "allreduce_share": sum(comm) / sum(times) if comm else None,
            "mb_per_step": (history.get("bytes_per_step") or [0])[-1] / 1e6,
            "startup_s": opt.last_run["startup_s"], "wall_s": time.monotonic() - t0}


def _scaling(spark, net, args, out) -> None:
    runs = _modes(args)
    out["runs"]["1 rank"] = []
    for rate in args.rates:
        net.reshape(rate)
        link = net.measure(net.hosts[0], net.hosts[1])
        out["links"][rate] = link
        print(f"# {rate}: one TCP connection gets {link['gbit_s']:.2f} Gbit/s, round trip {link['rtt_ms']:.3f} ms",
              flush=True)
    for _ in range(args.rounds):
        out["runs"]["1 rank"].append(_run(1, None, "idle", args))
        print(f"1 rank: {out['runs']['1 rank'][-1]}", flush=True)
        for rate in args.rates:
            net.reshape(rate)
            for name, sync, threads in runs:
                key = f"{rate} | {name} | {threads}"
                out["runs"].setdefault(key, []).append(_run(args.ranks, sync, threads, args))
                print(f"{args.ranks} ranks, {key}: {out['runs'][key][-1]}", flush=True)


def _elastic(spark, cluster, net, args, timeline: Timeline) -> dict:
    """A run of ``args.ranks`` ranks (at least 2) that loses a host after its first checkpoint and gets
    it back once it steps on fewer; ``model_dir`` on an S3 server on the services host."""
    import threading

    import numpy as np

    import optim
    from optim import TFOptimizer
    from tfnet import TFNet

    rate = args.rates[-1]
    net.reshape(rate)
    endpoint = cluster.start_s3("tfnet")
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    per_epoch, batch = 6, 12 * args.ranks  # 12 per rank on all ranks; 16 on 3, 24 on 2
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (per_epoch * batch, WIDTHS[0])).astype("float32")
    y = rng.integers(0, WIDTHS[-1], per_epoch * batch).astype("int64")
    opt = TFOptimizer(TFNet.from_keras(mlp()), optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optim.SGD(1e-3, momentum=0.9), model_dir="s3://tfnet/elastic", storage_options=options)
    lost = len(cluster.workers) - 1
    marks: dict = {}

    def chaos():
        start = time.monotonic()
        while time.monotonic() - start < 900 and timeline.first(start, "epoch_end") is None:
            time.sleep(0.05)
        marks["kill"] = time.monotonic()
        cluster.kill_worker(lost)
        while time.monotonic() - start < 900 and timeline.first(timeline.first(marks["kill"], "begin") or 1e18,
                                                                 "step") is None:
            time.sleep(0.05)
        marks["add"] = time.monotonic()
        cluster.add_worker(net.hosts[lost])
        cluster.wait_for_workers(args.ranks, timeout=120)
        marks["back"] = time.monotonic()

    thread = threading.Thread(target=chaos, daemon=True)
    os.environ["TFNET_HOROVOD_THREADS"] = "idle"
    t0 = time.monotonic()
    thread.start()
    opt.optimize((x, y), epochs=args.elastic_epochs, batch_size=batch, num_workers=args.ranks, min_workers=2,
                 elastic_wait=args.elastic_wait, checkpoint_every=per_epoch, verbose=0, timeout=300,
                 startup_timeout=900, max_retries=3)
    thread.join(10)
    run = opt.last_run
    kill, back = marks.get("kill"), marks.get("back")
    t = {
        "failed": timeline.first(kill, "warning", "failed"),
        "goes_on": timeline.first(kill, "warning", "goes on with"),
        "begin_small": timeline.first(kill, "begin"),
        "slots_seen": timeline.first(back, "warning", "are back") if back else None,
        "grow": timeline.first(back, "warning", f"goes on with {args.ranks} rank") if back else None,
    }
    t["step_small"] = timeline.first(t["begin_small"], "step") if t["begin_small"] else None
    t["begin_big"] = timeline.first(t["grow"], "begin") if t["grow"] else None
    t["step_big"] = timeline.first(t["begin_big"], "step") if t["begin_big"] else None

    def span(a, b):
        return None if a is None or b is None else b - a

    return {
        "rate": rate, "membership": run["membership"], "attempts": run["attempts"], "wall_s": time.monotonic() - t0,
        "elastic_wait": args.elastic_wait,
        "shrink_s": span(kill, t["step_small"]), "kill_to_failure_s": span(kill, t["failed"]),
        "failure_to_decision_s": span(t["failed"], t["goes_on"]), "decision_to_step_s": span(t["goes_on"], t["step_small"]),
        "grow_s": span(back, t["step_big"]), "back_to_seen_s": span(back, t["slots_seen"]),
        "seen_to_stop_s": span(t["slots_seen"], t["grow"]), "stop_to_step_s": span(t["grow"], t["step_big"]),
    }


def _report(out: dict, args) -> None:
    ceiling = (out.get("ceiling") or {}).get("ceiling")
    base = statistics.median(r["samples_s"] for r in out["runs"]["1 rank"])
    out["throughput_1"] = base
    if ceiling:
        c = out["ceiling"]
        print(f"\nmachine ceiling (plain TF, 1 thread, {args.ranks} processes at once vs 1 alone): {ceiling:.3f} "
              f"({c['alone']:.1f} samples/s alone, {sum(c['together']):.1f} together)")
    print(f"1 rank: {base:.1f} samples/s (per-rank batch {args.per_rank_batch})")
    for rate, link in out["links"].items():
        print(f"{rate}: one TCP connection {link['gbit_s']:.2f} Gbit/s, round trip {link['rtt_ms']:.3f} ms")
    ranks = f"{args.ranks} ranks"
    print(f"\n{ranks:8s} {'mode':46s} {'threads':7s} {'samples/s':>9s} {'efficiency':>10s} "
          f"{'/ ceiling':>9s} {'allreduce':>9s} {'MB/step':>8s}")
    for key, runs in out["runs"].items():
        if key == "1 rank":
            continue
        rate, mode, threads = key.split(" | ")
        thr = statistics.median(r["samples_s"] for r in runs)
        eff = thr / (args.ranks * base)
        rel = eff / ceiling if ceiling else float("nan")
        share = runs[-1]["allreduce_share"]
        out["modes"][key] = {"throughput": thr, "efficiency": eff, "of_ceiling": rel, "allreduce_share": share,
                             "mb_per_step": runs[-1]["mb_per_step"]}
        print(f"{rate:8s} {mode:46s} {threads:7s} {thr:9.1f} {eff:10.3f} {rel:9.3f} "
              f"{share if share is not None else float('nan'):9.1%} {runs[-1]['mb_per_step']:8.1f}")
    delay = out.get("delay_process")
    if delay:
        print(f"\nthe switch's delay process: {delay['packets']} packets, {delay['cpu_s']:.1f} s of CPU, "
              f"at most {delay['max_late_ms']:.2f} ms late")
    e = out.get("elastic")
    if e:
        def f(v):
            return "-" if v is None else f"{v:.1f} s"

        print(f"\nelastic ({args.ranks} ranks, min 2, {e['rate']}, elastic_wait {e['elastic_wait']:.0f} s; membership "
              f"{[m['ranks'] for m in e['membership']]}):")
        print(f"  shrink: {f(e['shrink_s'])} from the kill to the first step on fewer ranks (failure seen "
              f"{f(e['kill_to_failure_s'])}, then {f(e['failure_to_decision_s'])} to the decision, then "
              f"{f(e['decision_to_step_s'])} to the first step)")
        print(f"  grow:   {f(e['grow_s'])} from the worker's return to the first step on {args.ranks} ranks (slots "
              f"seen {f(e['back_to_seen_s'])}, then {f(e['seen_to_stop_s'])} to the stop at the epoch boundary, "
              f"then {f(e['stop_to_step_s'])} to the first step)")


if __name__ == "__main__":
    main()
