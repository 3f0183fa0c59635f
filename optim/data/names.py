"""Data given by name, as Keras's ``fit`` takes it: features as a dict by input name, labels as a dict by output name
(``fit({"title": t, "body": b}, {"priority": p, "department": d})``), put in the net's input and output order. Both
sides: the driver orders numpy arrays; a rank orders a ``tf.data`` input's elements as it reads them."""

from __future__ import annotations

from collections.abc import Mapping

from optim.errors import DataError
from optim.losses import output_index

__all__ = ["in_input_order", "in_output_order", "weights_in_output_order"]


def in_input_order(features: Mapping, input_names: list[str]) -> list:
    """Features given as a dict by input name (with or without ``:0``), as a list in input order.

    Raises:
        DataError: a key that names no input, or an input without an array.
    """
    by_input = {}
    for key, value in features.items():
        full = key if ":" in str(key) else f"{key}:0"
        if full not in input_names:
            raise DataError(f"The features name input {key!r}, which the net does not have. Inputs: {input_names}")
        by_input[full] = value
    missing = [n for n in input_names if n not in by_input]
    if missing:
        raise DataError(f"The features dict has no array for the net's inputs {missing}. Inputs: {input_names}")
    return [by_input[n] for n in input_names]


def in_output_order(labels: Mapping, output_names: list[str]) -> list:
    """Labels given as a dict by output name (a Keras model's dict keys or output layers' names, with or without
    ``:0``), as a list in output order; one label array for a net of one output.

    Raises:
        DataError: a key that names no output, or an output without labels.
    """
    by_output = {}
    for key, value in labels.items():
        try:
            by_output[output_index(str(key), output_names, "the labels dict")] = value
        except ValueError as exc:
            raise DataError(str(exc)) from None
    missing = [n for i, n in enumerate(output_names) if i not in by_output]
    if missing:
        raise DataError(f"The labels dict has no array for the net's outputs {missing}: Keras's fit takes one per "
                        f"output, and so does tfnet. Outputs: {output_names}")
    ordered = [by_output[i] for i in range(len(output_names))]
    return ordered[0] if len(ordered) == 1 else ordered


def weights_in_output_order(weights: Mapping, output_names: list[str]) -> list:
    """Sample weights given as a dict by output name (Keras's ``fit(..., sample_weight={"priority": w, ...})``), as a
    list in output order; one array for a net of one output.

    Raises:
        DataError: a key that names no output, or an output without weights (Keras's ``fit`` asks for one array per
            output too).
    """
    by_output = {}
    for key, value in weights.items():
        try:
            by_output[output_index(str(key), output_names, "the sample weights dict")] = value
        except ValueError as exc:
            raise DataError(str(exc)) from None
    missing = [n for i, n in enumerate(output_names) if i not in by_output]
    if missing:
        raise DataError(f"The sample weights dict has no array for the net's outputs {missing}: one per output, as "
                        f"Keras's fit takes them (ones for an output left unweighted). Outputs: {output_names}")
    ordered = [by_output[i] for i in range(len(output_names))]
    return ordered[0] if len(ordered) == 1 else ordered
