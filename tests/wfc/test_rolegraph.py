"""RoleGraph statistics on hand-built rollout graphs (every expected number worked out in a comment), its renderings,
and (at the end) the ``wfc inspect`` command that prints it."""

from __future__ import annotations

import json
import math

import networkx as nx
import pytest

from wfc.rolegraph import RoleGraph
from wfc.rollout import CallNode, RolloutGraph


def call(id, role, inv, *, p, c, t, status="ok", out=None, msg="", text=""):
    """A CallNode with ``p`` prompt tokens, ``c`` completion tokens and clock span ``t = (started, finished)``."""
    return CallNode(id=id, role=role, invocation=inv, messages=[{"role": "user", "content": msg}],
                    prompt_ids=list(range(p)), completion_ids=list(range(c)), logprobs=[0.0] * c, text=text,
                    outputs=out, status=status, started=t[0], finished=t[1])


# G1 (ok): two voters in parallel (spans 1-3 and 2-4), then an aggregator whose prompt holds both answers.
#   voter   p10 c5 "7" | voter p10 c5 "8" | aggregator p20 c2      edges: voter->aggregator x2
# G2 (crash): one voter with a format error (no outputs), then a crashed aggregator. No edges.
#   voter   p10 c3     | aggregator p20 c0
def g1():
    return RolloutGraph([
        call(0, "voter", 0, p=10, c=5, t=(1, 3), out={"answer": "7"}),
        call(1, "voter", 1, p=10, c=5, t=(2, 4), out={"answer": "8"}),
        call(2, "aggregator", 0, p=20, c=2, t=(5, 6), out={"answer": "7"}, msg="candidates: 7, 8"),
    ], example={"question": "q1"}, outputs={"answer": "7"})


def g2():
    return RolloutGraph([
        call(0, "voter", 0, p=10, c=3, t=(1, 2), status="format_error", text="??"),
        call(1, "aggregator", 0, p=20, c=0, t=(3, 4), status="crash", msg="candidates:"),
    ], example={"question": "q2"}, status="crash", error="RuntimeError: down")


@pytest.fixture
def rg():
    return RoleGraph.from_rollouts([g1(), g2()])


def test_role_stats_by_hand(rg):
    assert rg.num_rollouts == 2
    assert rg.status_counts == {"ok": 1, "crash": 1}
    assert rg.role_names == ["voter", "aggregator"]
    v, a = rg.stats("voter"), rg.stats("aggregator")
    # voter: calls per rollout [2, 1]; parallel in G1 -> fan-out 2; 3 calls: prompt 30, completion 5+5+3 = 13
    assert (v.calls_mean, v.calls_min, v.calls_max, v.fan_out) == (1.5, 1, 2, 2)
    assert v.prompt_tokens_mean == 10 and v.completion_tokens_mean == pytest.approx(13 / 3)
    assert v.tokens_per_rollout == pytest.approx((30 + 13) / 2)  # 21.5
    assert v.format_error_rate == pytest.approx(1 / 3) and v.crash_rate == 0
    # aggregator: [1, 1]; prompt 40 / 2 calls = 20; completion 2 / 2 = 1; 42 tokens over 2 rollouts; 1 crash of 2
    assert (a.calls_mean, a.calls_min, a.calls_max, a.fan_out) == (1.0, 1, 1, 1)
    assert (a.prompt_tokens_mean, a.completion_tokens_mean, a.tokens_per_rollout) == (20, 1, 21)
    assert a.format_error_rate == 0 and a.crash_rate == 0.5
    # all tokens: 43 + 42 = 85; completion tokens: 13 + 2 = 15
    assert v.token_share == pytest.approx(43 / 85) and a.token_share == pytest.approx(42 / 85)
    assert v.completion_share == pytest.approx(13 / 15) and a.completion_share == pytest.approx(2 / 15)
    assert math.isclose(sum(s.token_share for s in rg.roles), 1.0)


def test_edges_aggregate_calls_and_rollouts(rg):
    assert [(e.src, e.dst, e.count, e.rollout_share) for e in rg.edges] == [("voter", "aggregator", 2, 0.5)]
    assert rg.edge("aggregator", "voter") is None


def test_role_absent_from_a_rollout_counts_as_zero_calls_and_order_is_first_seen():
    # G_a calls only "gen"; G_b calls "opt" then "gen" (ids in that order) -> roles [gen, opt] (gen seen first)
    ga = RolloutGraph([call(0, "gen", 0, p=1, c=1, t=(1, 2))], example={})
    gb = RolloutGraph([call(0, "opt", 0, p=1, c=1, t=(1, 2)), call(1, "gen", 0, p=1, c=1, t=(3, 4))], example={})
    r = RoleGraph.from_rollouts([ga, gb])
    assert r.role_names == ["gen", "opt"]
    opt = r.stats("opt")
    assert (opt.calls_mean, opt.calls_min, opt.calls_max, opt.fan_out) == (0.5, 0, 1, 1)
    assert RoleGraph.from_rollouts([gb, ga]).role_names == ["opt", "gen"]


def test_self_edge_of_a_reviser_is_kept():
    g = RolloutGraph([
        call(0, "reviser", 0, p=4, c=2, t=(1, 2), out={"draft": "v1"}),
        call(1, "reviser", 1, p=6, c=2, t=(3, 4), out={"draft": "v2"}, msg="previous: v1"),
    ], example={})
    r = RoleGraph.from_rollouts([g])
    assert [(e.src, e.dst, e.count, e.rollout_share) for e in r.edges] == [("reviser", "reviser", 1, 1.0)]
    assert r.stats("reviser").fan_out == 1  # sequential


def test_no_tokens_gives_zero_shares():
    g = RolloutGraph([call(0, "a", 0, p=0, c=0, t=(1, 2), status="crash")], example={}, status="crash")
    s = RoleGraph.from_rollouts([g]).stats("a")
    assert (s.token_share, s.completion_share, s.crash_rate) == (0.0, 0.0, 1.0)


def test_bad_input():
    with pytest.raises(ValueError, match="at least one rollout"):
        RoleGraph.from_rollouts([])
    with pytest.raises(TypeError, match="RolloutGraph"):
        RoleGraph.from_rollouts([{"calls": []}])
    with pytest.raises(KeyError, match="voter"):
        RoleGraph.from_rollouts([g1()]).stats("nobody")


def test_to_dot(rg):
    dot = rg.to_dot()
    assert dot.startswith('digraph "roles" {') and dot.rstrip().endswith("}")
    assert '"voter" [label="voter\\n1-2 calls' in dot
    assert '"aggregator" [label=' in dot and "crash 50%" in dot
    assert '"voter" -> "aggregator" [label="2x, 50% of rollouts"];' in dot
    assert dot.count("{") == dot.count("}")


def test_to_dot_quotes_dotted_paths():
    g = RolloutGraph([call(0, "team.lead", 0, p=1, c=1, t=(1, 2), out={"plan": "x"}),
                      call(1, "team.worker", 0, p=1, c=1, t=(3, 4), msg="do x")], example={})
    dot = RoleGraph.from_rollouts([g]).to_dot(name='my "prog"')
    assert 'digraph "my \\"prog\\"" {' in dot
    assert '"team.lead" -> "team.worker"' in dot


def test_to_mermaid(rg):
    text = rg.to_mermaid()
    lines = text.splitlines()
    assert lines[0] == "flowchart LR"
    assert lines[1].startswith('  r0["voter<br/>') and lines[2].startswith('  r1["aggregator<br/>')
    assert '  r0 -->|"2x, 50%"| r1' in lines


def test_table(rg):
    table = rg.table()
    assert "role graph over 2 rollout(s) (crash 1, ok 1)" in table
    for piece in ("voter", "aggregator", "1.50 / 1 / 2", "50.6%", "33%", "voter -> aggregator"):
        assert piece in table  # 43/85 = 50.6% token share; 1/3 format errors
    assert str(rg) == table


def test_to_dict_round_trips_through_json(rg):
    data = json.loads(rg.to_json())
    assert data == rg.to_dict()
    assert RoleGraph.model_validate(data) == rg
    assert data["roles"][0]["role"] == "voter" and data["edges"][0]["count"] == 2


def test_to_networkx(rg):
    g = rg.to_networkx()
    assert isinstance(g, nx.DiGraph) and list(g.nodes) == ["voter", "aggregator"]
    assert g.nodes["voter"]["fan_out"] == 2 and g.edges["voter", "aggregator"]["count"] == 2
    assert g.graph["num_rollouts"] == 2


