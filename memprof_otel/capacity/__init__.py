"""How much more fits: a memory model of each instrumented model (peak as a function of input
shape), the memory budget that applies to its device, and the answers built from the two
(headroom, largest safe batch). ``fit`` and ``model`` and ``budget`` are pure; ``shapes`` reads a
forward's arguments by duck typing (no torch import); ``budget_reader`` is the I/O."""
