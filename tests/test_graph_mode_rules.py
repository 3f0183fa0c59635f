"""A rule of ``tfnet/`` and ``optim/``, read from the source (``ast``): no ``==`` or ``!=`` inside the arguments of a
``tf.`` call, except between dtypes, shapes and ranks. tfnet converts ONNX models and imports frozen graphs inside a
``tf.Graph``, where TensorFlow compares tensors with ``==`` by identity (tensor equality is on only eagerly and
inside ``tf.function``): ``tf.where(t == 0, a, b)`` is ``tf.where(False, a, b)``, ``b`` everywhere, with no error.
``MelWeightMatrix``'s first version and the run-time ``Resize`` to one pixel read wrong values that way;
``tf.equal`` and ``tf.not_equal`` say what they mean in every mode."""

from __future__ import annotations

import ast
import os

import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATIC = (".dtype", ".shape", ".rank", ".ndim")  # Python values while the graph is built


def tensor_equalities(source: str) -> list[tuple[int, str]]:
    """``(line, comparison)`` for each ``==``/``!=`` inside an argument of a ``tf.`` call."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func).startswith("tf.")):
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            for sub in ast.walk(arg):
                if isinstance(sub, ast.Compare) and any(isinstance(o, (ast.Eq, ast.NotEq)) for o in sub.ops):
                    text = ast.unparse(sub)
                    if not any(s in text for s in STATIC):
                        found.append((sub.lineno, text))
    return found


def test_the_check_finds_a_tensor_compared_with_equals_and_leaves_dtypes_alone():
    code = "y = tf.where(rise == 0, a, b)\nz = tf.cast(x, tf.uint8 if x.dtype == tf.bool else t)\nw = tf.equal(t, 0)\n"
    assert tensor_equalities(code) == [(1, "rise == 0")]


def test_equals_compares_tensors_by_identity_in_a_graph():
    """What the rule guards against, as TensorFlow does it."""
    with tf.Graph().as_default():
        t = tf.constant([0, 1])
        assert (t == 0) is False
        assert tf.equal(t, 0).dtype == tf.bool


def test_no_tensor_is_compared_with_equals_in_a_tf_call():
    found = {}
    for package in ("tfnet", "optim"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as f:
                        hits = tensor_equalities(f.read())
                    if hits:
                        found[os.path.relpath(path, ROOT)] = hits
    assert found == {}, f"use tf.equal / tf.not_equal: {found}"
