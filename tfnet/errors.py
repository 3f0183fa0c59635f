"""Typed errors raised by tfnet.

Every error derives from :class:`TFNetError` and from the builtin exception a caller would expect
(``ValueError``, ``TypeError``, ``KeyError``-like lookups are ``ValueError``), so both
``except ValueError`` and ``except tfnet.TFNetError`` work.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "TFNetError",
    "GraphLoadError",
    "TensorNameError",
    "InputSpecError",
    "InputTypeError",
    "WeightError",
    "NoWeightsError",
    "WeightTypeError",
    "GraphExecutionError",
    "GradientUnavailableError",
    "closest_names",
    "first_line",
]


class TFNetError(Exception):
    """Base class of every error tfnet raises on purpose."""


class GraphLoadError(TFNetError, ValueError):
    """A model file could not be read as a TensorFlow graph."""


class TensorNameError(TFNetError, ValueError):
    """A tensor or weight name does not exist in the graph."""


class InputSpecError(TFNetError, ValueError):
    """An input has the wrong rank or shape, or the wrong number of inputs was given."""


class InputTypeError(TFNetError, TypeError):
    """An input has a dtype that the graph's input cannot take."""


class WeightError(TFNetError, ValueError):
    """A weight update names an unknown weight or has the wrong shape or dtype."""


class NoWeightsError(TFNetError, ValueError):
    """An operation that needs weights was called on a graph without any."""


class WeightTypeError(TFNetError, TypeError):
    """A weight value has a dtype that cannot be stored in the weight."""


class GraphExecutionError(TFNetError, RuntimeError):
    """TensorFlow failed while running the graph (for example, a reshape that only works at one
    batch size)."""


class GradientUnavailableError(TFNetError, RuntimeError):
    """TensorFlow cannot differentiate the graph (for example through v1 control flow loops,
    whose loop context a frozen graph does not store). ``forward`` still works."""


class KernelCheckError(TFNetError, RuntimeError):
    """TensorFlow's CPU kernels compute a wrong gradient on this CPU (``tfnet.kernels.self_check``)."""

    retryable = False


class KerasSourceError(TFNetError, ValueError):
    """The net has no Keras model to convert back to (it did not come from ``from_keras``, or graph surgery changed
    it), or its weights no longer match that model's variables (``TFNet.to_keras``)."""


class RegularizerError(TFNetError, ValueError):
    """A weight's regularizer Keras cannot take or rebuild (a plain function, or a class not registered with
    ``@keras.saving.register_keras_serializable()``): :mod:`tfnet.regularizers`."""

    retryable = False


def closest_names(name: str, candidates: Iterable[str], n: int = 5) -> list[str]:
    """Returns up to ``n`` names from ``candidates`` that look most like ``name``.

    Close spellings come first (``difflib``); names sharing the last path component follow.
    """
    candidates = list(dict.fromkeys(candidates))
    close = difflib.get_close_matches(name, candidates, n=n, cutoff=0.5)
    if len(close) < n:
        leaf = name.rsplit("/", 1)[-1].split(":")[0]
        for c in candidates:
            if c not in close and leaf and leaf in c:
                close.append(c)
                if len(close) == n:
                    break
    return close


def unknown_name_message(kind: str, name: str, candidates: Iterable[str]) -> str:
    candidates = list(candidates)
    close = closest_names(name, candidates)
    msg = f"Unknown {kind} {name!r}."
    if close:
        msg += " Closest existing names: " + ", ".join(repr(c) for c in close) + "."
    elif candidates:
        shown = ", ".join(repr(c) for c in candidates[:10])
        more = f" (and {len(candidates) - 10} more)" if len(candidates) > 10 else ""
        msg += f" Existing names: {shown}{more}."
    else:
        msg += f" The graph has no {kind}s."
    return msg


def first_line(error: BaseException | str | None, limit: int | None = None) -> str:
    """The first line of an error's text (of an exception with none: its class name; of no text: ""), at most
    ``limit`` characters.

    >>> first_line(ValueError("bad\\nmore")), first_line(KeyError()), first_line("  ")
    ('bad', 'KeyError', '')
    """
    text = "" if error is None else str(error).strip()
    if not text:
        return type(error).__name__ if isinstance(error, BaseException) else ""
    line = text.splitlines()[0]
    return line[:limit] if limit else line


def op_error_reason(message: str) -> str:
    """The line of a TensorFlow op error's text that says what went wrong, not where: a ``tf.function``'s error
    begins "Graph execution error:" and "Detected at node ... defined at", then the stack, then the reason.

    >>> op_error_reason("Graph execution error:\\n\\nDetected at node y defined at (most recent call last):\\n"
    ...                 "<stack traces unavailable>\\nInput to reshape is a tensor with 12 values\\n\\t [[{{node y}}]]")
    'Input to reshape is a tensor with 12 values'
    """
    skip = ("Graph execution error", "Detected at node", "File ", "Node:", "[[", "defined at", "<stack traces")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(skip)]
    return said[-1] if said else (lines[0] if lines else "")
