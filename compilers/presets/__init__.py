"""Presets: a task's splits, the program built for it, the metric it trains on and the recipe it compiles with, kept
together under one name so that the example that runs them and every benchmark that measures against them use the
same ones.

- ``compilers.presets.arithmetic``: ``make demo``'s Voting workflow on generated one-step word problems.
- ``compilers.presets.svamp_transfer``: the demo's program trained on the demo's problems plus harder generated ones,
  measured on SVAMP (``examples/svamp_transfer.py``).
- ``compilers.presets.codegen``: the code workflows (writer, reviewer, fixer; the writer alone; the writer retrying)
  on generated function-writing tasks (``examples/code_workflow.py``).
- ``compilers.presets.suite``: the suite's tasks (issue 46), each a program written as a DSPy user would, its
  disjoint splits and its metric (``benchmarks/suite.py``).

The recipes themselves (config fields only) are ``compilers.recipes``.
"""
