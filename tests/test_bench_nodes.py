"""benchmarks/nodes.py: the communication column sums each node's profiled phases, and rank 0's, apart."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from nodes import comm_by_node  # noqa: E402


def test_comm_is_summed_over_phases_per_node():
    steady = {"comm/exposed_s/update_actor": 0.25, "comm/exposed_s/ref": 0.5, "comm/total_s/update_actor": 1.0,
              "comm/node1/exposed_s/update_actor": 0.75, "comm/node1/exposed_s/ref": 0.5,
              "comm/node1/bytes/update_actor": 4e6, "comm/sampled": 1.0, "timing_s/step": 3.0}
    out = comm_by_node(steady)
    assert out["rank0"] == {"exposed_s": pytest.approx(0.75), "total_s": pytest.approx(1.0)}
    assert out["node1"] == {"exposed_s": pytest.approx(1.25)}  # bytes are not seconds
