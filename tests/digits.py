"""scikit-learn's digits and the small CNN the tests use: the same helpers as the main job's
(:mod:`examples.digits`)."""

from examples.digits import cnn, load, split

__all__ = ["cnn", "load", "split"]
