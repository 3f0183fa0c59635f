"""Shared checks of ONNX fixtures (scripts/export_onnx_fixtures.py): forward against onnxruntime and
PyTorch's stored outputs, input and weight gradients against PyTorch's stored gradients."""

import os

import numpy as np

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "onnx")


def path_of(name):
    return os.path.join(FIXTURES, name + ".onnx")


def stored(name):
    return dict(np.load(os.path.join(FIXTURES, name + ".npz")))


def rel(a, b):
    return float(np.abs(np.asarray(a) - b).max() / max(np.abs(b).max(), 1e-12))


def as_list(x):
    return x if isinstance(x, list) else [x]


def run_ort(model, inputs):
    import onnxruntime as ort

    session = ort.InferenceSession(model if isinstance(model, str) else model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: v for i, v in zip(session.get_inputs(), inputs)})


def inputs_of(net, data):
    return [data[f"in_{k}"] for k in range(len(net.input_names))]


def check_forward(net, name, tol=1e-4):
    data = stored(name)
    inputs = inputs_of(net, data)
    outs = as_list(net.forward(inputs))
    for k, (got, want) in enumerate(zip(outs, run_ort(path_of(name), inputs))):
        assert rel(got, want) < tol, (name, k, "onnxruntime", rel(got, want))
        assert rel(got, data[f"out_{k}"]) < tol, (name, k, "pytorch", rel(got, data[f"out_{k}"]))


def gradient_error(got, want, largest):
    """Relative to the gradient's own scale; a gradient that vanishes (below 1e-5 of the net's largest,
    such as a convolution bias before an instance norm, zero in exact arithmetic) is compared on the
    scale of the net's largest gradient, since float32 cannot resolve it on its own."""
    scale = np.abs(want).max()
    return float(np.abs(got - want).max() / (scale if scale > 1e-5 * largest else largest))


def check_backward(net, name, tol=1e-3):
    data = stored(name)
    inputs = inputs_of(net, data)
    grad_out = [data[f"grad_out_{k}"] for k in range(len(net.output_names))]
    grad_in, grad_w = net.backward(inputs, grad_out)
    want = {k[len("grad_w/"):]: v for k, v in data.items() if k.startswith("grad_w/")}
    assert want and set(want) <= set(grad_w), sorted(set(want) - set(grad_w))
    largest = max(np.abs(g).max() for g in want.values())
    errors = {n: gradient_error(grad_w[n], g, largest) for n, g in want.items()}
    worst = max(errors, key=errors.get)
    assert errors[worst] < tol, (name, worst, errors[worst])
    for k, g in enumerate(as_list(grad_in)):
        if f"grad_in_{k}" in data:
            want_in = data[f"grad_in_{k}"]
            assert gradient_error(g, want_in, np.abs(want_in).max()) < tol, (name, k, rel(g, want_in))
        else:  # integer input (token ids): no gradient
            assert g is None and not np.issubdtype(inputs[k].dtype, np.floating)
    return errors
