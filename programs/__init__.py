"""Workflow topologies, each parameterised by a task signature (question -> answer, prompt -> code, ...)."""

from programs.eval_opt import EvalOpt
from programs.orch_workers import OrchWorkers
from programs.retry import Retry
from programs.single import Single
from programs.voting import Voting

TOPOLOGIES = {"single": Single, "evalopt": EvalOpt, "voting": Voting, "orchworkers": OrchWorkers,
              "retry": Retry}

__all__ = ["EvalOpt", "OrchWorkers", "Retry", "Single", "Voting", "TOPOLOGIES"]
