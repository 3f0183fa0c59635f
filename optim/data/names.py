"""Data given by name, as Keras's ``fit`` takes it: features as a dict by input name, labels as a dict by output name
(``fit({"title": t, "body": b}, {"priority": p, "department": d})``), put in the net's input and output order. Both
sides: the driver orders numpy arrays; a rank orders a ``tf.data`` input's elements as it reads them."""

from __future__ import annotations

from collections.abc import Mapping

from optim.errors import DataError
from optim.losses import output_index

__all__ = ["by_output", "in_input_order", "in_output_order", "weights_in_output_order"]


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


def by_output(pairs, output_names: list[str], where: str, missing: str, error: type = DataError) -> list:
    """The values of ``(output name, value)`` pairs, in output order: a key names an output as
    :func:`optim.losses.output_index` reads it (a Keras model's dict key or output layer's name, with or without ``:0``).
    ``where`` names the dict in a message, ``missing`` says what the outputs without a value lack (``{missing}``
    takes their names).

    Raises:
        ``error``: a key that names no output, or an output without a value.
    """
    found = {}
    for key, value in pairs:
        try:
            found[output_index(str(key), output_names, where)] = value
        except ValueError as exc:
            raise error(str(exc)) from None
    absent = [n for i, n in enumerate(output_names) if i not in found]
    if absent:
        raise error(missing.format(missing=absent) + f" Outputs: {output_names}")
    return [found[i] for i in range(len(output_names))]


def in_output_order(labels: Mapping, output_names: list[str]) -> list:
    """Labels given as a dict by output name, as a list in output order (:func:`by_output`); one label array for a
    net of one output.

    Raises:
        DataError: a key that names no output, or an output without labels.
    """
    ordered = by_output(labels.items(), output_names, "the labels dict",
                        "The labels dict has no array for the net's outputs {missing}: Keras's fit takes one per output, "
                        "and so does tfnet.")
    return ordered[0] if len(ordered) == 1 else ordered


def weights_in_output_order(weights: Mapping, output_names: list[str]) -> list:
    """Sample weights given as a dict by output name (Keras's ``fit(..., sample_weight={"priority": w, ...})``), as a
    list in output order (:func:`by_output`); one array for a net of one output.

    Raises:
        DataError: a key that names no output, or an output without weights (Keras's ``fit`` asks for one array per
            output too).
    """
    ordered = by_output(weights.items(), output_names, "the sample weights dict",
                        "The sample weights dict has no array for the net's outputs {missing}: one per output, as "
                        "Keras's fit takes them (ones for an output left unweighted).")
    return ordered[0] if len(ordered) == 1 else ordered
