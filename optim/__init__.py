"""optim: optimisation and distribution for tfnet (update rules, losses, TFOptimizer)."""

__all__: list[str] = []
