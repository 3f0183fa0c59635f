"""The optimiser update alone, on ResNet-50's 214 trainable tensors (25.6 M weights): tfnet's
methods (chains of optax-style parts) against the Keras 3 optimiser of the same name, both compiled
with ``tf.function`` and updating variables in place, timed in alternation in this process.

``--old REV`` adds a third side: the monolithic rules (``sgd_rule``, ``adam_rule``, ...) of
``optim/transforms.py`` at git revision REV (before issue 11's factoring), read with ``git show``.

    python benchmarks/bench_transforms.py [--updates 20] [--rounds 5] [--old ec9387a] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, finish, interleaved, machine, median, setup_env  # noqa: E402

METHODS = {
    "sgd momentum": (lambda optim: optim.SGD(0.01, momentum=0.9), lambda k: k.SGD(0.01, momentum=0.9),
                     lambda T: T.chain(T.sgd_rule(0.01, 0.9))),
    "adam": (lambda optim: optim.Adam(1e-3), lambda k: k.Adam(1e-3), lambda T: T.chain(T.adam_rule(1e-3))),
    "rmsprop centered momentum": (lambda optim: optim.RMSprop(1e-3, momentum=0.9, centered=True),
                                  lambda k: k.RMSprop(1e-3, momentum=0.9, centered=True),
                                  lambda T: T.chain(T.rmsprop_rule(1e-3, momentum=0.9, centered=True))),
    "adagrad": (lambda optim: optim.Adagrad(1e-3), lambda k: k.Adagrad(1e-3), lambda T: T.chain(T.adagrad_rule(1e-3))),
}


def old_transforms(rev: str):
    """``optim/transforms.py`` as it was at ``rev``, imported under another name."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = subprocess.run(["git", "-C", root, "show", f"{rev}:optim/transforms.py"], capture_output=True, text=True,
                         check=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "old_transforms.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("old_transforms", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def side_chain(transform, shapes, grads, updates):
    """Update ``updates`` times with an init/update transformation, state and weights in variables."""
    import tensorflow as tf

    weights = {n: tf.Variable(tf.random.stateless_normal(s, [1, i])) for i, (n, s) in enumerate(shapes.items())}
    state = tf.nest.map_structure(tf.Variable, transform.init({n: v.value() for n, v in weights.items()}))

    @tf.function(autograph=False)
    def step():
        params = {n: v.value() for n, v in weights.items()}
        deltas, new = transform.update(grads, tf.nest.map_structure(lambda v: v.value(), state), params)
        for n, v in weights.items():
            v.assign_add(deltas[n])
        for var, value in zip(tf.nest.flatten(state), tf.nest.flatten(new)):
            var.assign(value)

    def run():
        for _ in range(updates):
            step()
        weights[next(iter(weights))].numpy()

    return run


def side_keras(opt, shapes, grads, updates):
    import keras
    import tensorflow as tf

    weights = {n: keras.Variable(tf.random.stateless_normal(s, [1, i]), name=f"w{i}")
               for i, (n, s) in enumerate(shapes.items())}
    names = list(weights)
    opt.build([weights[n] for n in names])
    step = tf.function(lambda: opt.apply_gradients([(grads[n], weights[n]) for n in names]), autograph=False)

    def run():
        for _ in range(updates):
            step()
        weights[names[0]].numpy()

    return run


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--updates", type=int, default=20, help="updates per timed call")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--old", default=None, help="git revision whose monolithic rules to time as a third side")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(True)
    print(banner(), flush=True)
    import keras
    import tensorflow as tf

    import optim

    model = keras.applications.ResNet50(weights=None)
    shapes = {v.path: tuple(v.shape) for v in model.trainable_variables}
    del model
    grads = {n: tf.random.stateless_normal(s, [2, i]) * 1e-3 for i, (n, s) in enumerate(shapes.items())}
    size = sum(int(tf.size(g)) for g in grads.values())
    old = old_transforms(args.old) if args.old else None
    out = {"machine": machine(), "tensors": len(shapes), "weights": size, "updates": args.updates, "methods": {}}
    print(f"{len(shapes)} tensors, {size / 1e6:.1f} M weights; ms per update (median of {args.rounds} rounds of "
          f"{args.updates}); ratio = Keras / tfnet (>= 1: tfnet as fast or faster)")
    for name in args.methods.split(","):
        ours, theirs, previous = METHODS[name]
        fns = {"tfnet": side_chain(ours(optim), shapes, grads, args.updates),
               "keras": side_keras(theirs(keras.optimizers), shapes, grads, args.updates)}
        if old is not None:
            fns["old rules"] = side_chain(previous(old), shapes, grads, args.updates)
        times = interleaved(fns, args.rounds)
        ms = {k: 1e3 * median(v) / args.updates for k, v in times.items()}
        out["methods"][name] = {"ms_per_update": ms, "keras_over_tfnet": ms["keras"] / ms["tfnet"],
                                "times": times}
        line = f"{name:26s} tfnet {ms['tfnet']:7.2f}  keras {ms['keras']:7.2f}  ratio {ms['keras'] / ms['tfnet']:.2f}"
        if old is not None:
            line += f"   old rules {ms['old rules']:7.2f}  old/new {ms['old rules'] / ms['tfnet']:.2f}"
        print(line, flush=True)
        del fns
    print(f"machine: {out['machine']}")
    finish(args.json, out)
    return out


if __name__ == "__main__":
    main()
