"""`buun bench`'s request: its options parsed and checked against each other when it is made, with
no typer and nothing started, and the job it asks for."""

from __future__ import annotations

from pathlib import Path

import pytest

from buun_tool.base.errors import UsageError
from buun_tool.measure.bench_request import BenchRequest


def test_a_run_parses_its_lists() -> None:
    """The tree sweep adds the chain (budget 0) to the budgets asked."""
    req = BenchRequest(suite="code, math", mode="raw", tree_budget="15,22", concurrency="2,4")
    assert req.job == "run"
    assert (req.suites, req.modes, req.tree_budgets, req.levels) == (("code", "math"), ("raw",), (0, 15, 22), (2, 4))


def test_a_report_or_a_comparison_parses_nothing_of_a_run(tmp_path: Path) -> None:
    report = BenchRequest(report_from=tmp_path, suite="no-such-suite")
    assert report.job == "report" and report.suites == ()
    assert BenchRequest(compare=(tmp_path, tmp_path)).job == "compare"


@pytest.mark.parametrize(("options", "says"), [
    ({"suite": "code,poetry"}, "--suite 'code,poetry'"),
    ({"mode": ""}, "--mode ''"),
    ({"concurrency": "0"}, "--concurrency '0'"),
    ({"concurrency": "two"}, "--concurrency 'two'"),
    ({"tree_budget": "8", "url": "http://127.0.0.1:1"}, "--tree-budget sweeps servers"),
    ({"concurrency": "4", "url": "http://127.0.0.1:1"}, "--concurrency starts servers"),
    ({"rpc": "h:1", "url": "http://127.0.0.1:1"}, "--rpc starts servers"),
    ({"bandwidth_gbs": 0.0}, "--bandwidth-gbs 0"),
])
def test_options_that_do_not_go_together_are_refused(options: dict, says: str) -> None:
    with pytest.raises(UsageError, match=says.replace("'", ".").replace("(", r"\(")):
        BenchRequest(**options)


def test_report_from_and_compare_are_two_commands(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="two different commands"):
        BenchRequest(report_from=tmp_path, compare=(tmp_path, tmp_path))
