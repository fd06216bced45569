"""A math Voting workflow: three voters answer in parallel, an aggregator decides. Used by the CLI examples:

    wfc inspect examples/math_voting.py:program --model smollm2-135m
    wfc compile examples/math_voting.py:program --task arithmetic --steps 12 --out artifacts/math-voting
"""

from programs import Voting
from wfc.tasks.signatures import SolveMath

program = Voting(SolveMath, n=3, name="math-voting")
