"""chainweaver.testing: fakes that record calls and play outcomes in order, runs of flows
and flow files against them, the assertions and their messages, the `flow_kit` fixture,
and its pytest plugin loaded from a conftest.py as the docs say (without the MCP extra)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from chainweaver import (
    Flow,
    FlowStep,
    FlowValidationError,
    RetryPolicy,
    SideEffectLevel,
    ToolSafetyContract,
    tool,
)
from chainweaver.testing import FakeTool, FlowKit, run_flow

ROOT = Path(__file__).resolve().parents[2]
READ = ToolSafetyContract(SideEffectLevel.READ)
WRITE = ToolSafetyContract(SideEffectLevel.WRITE, requires_approval=True,
                           approval_reason="charges the card")


class Quote(BaseModel):
    cents: int


@tool(safety=READ)
def find_order(order_id: str) -> dict:
    return {"order_id": order_id, "total_cents": 1000}


@tool(safety=READ)
def quote(total_cents: int) -> Quote:
    raise RuntimeError("the real quote service must not be called")


@tool(safety=WRITE)
def charge(cents: int) -> dict:
    return {"charged": cents}


RETRIED = RetryPolicy(max_attempts=3, backoff_seconds=0)
FLOW = Flow(name="pricing", description="Quote an order.",
            steps=[FlowStep("find_order"), FlowStep("quote", retry=RETRIED)])


def test_a_fake_stands_in_for_the_tool_and_records_its_calls() -> None:
    fake = FakeTool(quote, {"cents": 900})
    assert (fake.name, fake.tool.input_schema, fake.tool.output_schema, fake.tool.safety) == (
        "quote", quote.input_schema, Quote, READ)
    run = run_flow(FLOW, {"order_id": "A-1"}, tools=[find_order, fake])
    assert run.success and run.output == {"cents": 900}
    assert fake.calls == [{"total_cents": 1000}]
    assert run.fakes == {"quote": fake}
    run.assert_output({"cents": 900}).assert_succeeded()


def test_outcomes_play_in_order_and_the_last_repeats() -> None:
    fake = FakeTool(quote, TimeoutError, ConnectionError("down"), {"cents": 1})
    run = run_flow(FLOW, {"order_id": "A-1"}, tools=[find_order, fake])
    record = run.assert_step("quote", status="completed", attempts=3)
    assert [e.type for e in record.attempt_errors] == ["TimeoutError", "ConnectionError"]
    assert "fake quote raised TimeoutError" in record.attempt_errors[0].message
    again = run_flow(FLOW, {"order_id": "A-2"}, tools=[find_order, fake])
    again.assert_step("quote", attempts=1, outputs={"cents": 1})
    fake.assert_called(4, last={"total_cents": 1000})


def test_an_error_that_outlasts_the_retries_fails_the_flow() -> None:
    fake = FakeTool(quote, TimeoutError("slow"))
    run = run_flow(FLOW, {"order_id": "A-1"}, tools=[find_order, fake])
    run.assert_failed("TimeoutError", step="quote")
    run.assert_step("quote", status="failed", attempts=3, error_type="TimeoutError")
    assert fake.call_count == 3


def test_a_callable_outcome_computes_from_the_input() -> None:
    fake = FakeTool(quote, lambda given: {"cents": given["total_cents"] // 2})
    run = run_flow(FLOW, {"order_id": "A-1"}, tools=[find_order, fake])
    run.assert_output({"cents": 500})
    run.assert_step("quote", inputs={"total_cents": 1000})


def test_a_fake_by_name_needs_an_input_schema() -> None:
    with pytest.raises(TypeError, match="give the real Tool, or input_schema="):
        FakeTool("lookup")
    fake = FakeTool("lookup", {"x": 1}, input_schema=Quote)
    assert fake.tool.input_fields == ("cents",) and fake.tool.output_schema is None


def test_a_fake_output_is_validated_like_the_real_one() -> None:
    run = run_flow(FLOW, {"order_id": "A-1"}, tools=[find_order, FakeTool(quote, {"c": 1})])
    run.assert_failed(step="quote")
    assert run.result.error is not None and "cents" in run.result.error.message


# ------------------------------------------------------------------ assertion messages


def test_failed_assertions_say_what_happened() -> None:
    failing = run_flow(FLOW, {"order_id": "A-1"},
                       tools=[find_order, FakeTool(quote, LookupError("gone"))])
    with pytest.raises(AssertionError) as raised:
        failing.assert_succeeded()
    message = str(raised.value)
    assert message.startswith("flow pricing failed: at step 'quote': ")
    assert "LookupError: gone" in message
    assert re.search(r"^quote +failed +3 ", message, re.MULTILINE)  # the step table
    with pytest.raises(AssertionError, match="failed with error type 'LookupError', "
                                             "expected 'KeyError'"):
        failing.assert_failed("KeyError")
    with pytest.raises(AssertionError, match="step 'quote': status is 'failed', expected "
                                             "'completed'"):
        failing.assert_step("quote", status="completed")
    with pytest.raises(AssertionError, match=r"no step 'price' in the run of pricing "
                                             r"\(steps that ran: find_order, quote\)"):
        failing.step("price")
    passing = run_flow(FLOW, {"order_id": "A-1"},
                       tools=[find_order, FakeTool(quote, {"cents": 5})])
    with pytest.raises(AssertionError, match="'cents' is 5, expected 6"):
        passing.assert_output({"cents": 6})
    with pytest.raises(AssertionError, match="succeeded, expected it to fail"):
        passing.assert_failed()
    with pytest.raises(AssertionError, match="missing 'eta'.*unexpected 'order_id'"):
        passing.assert_step("find_order", outputs={"total_cents": 1000, "eta": "now"})


def test_fake_call_assertions_say_what_happened() -> None:
    fake = FakeTool(quote)
    with pytest.raises(AssertionError, match="fake quote was never called"):
        fake.assert_called()
    with pytest.raises(AssertionError, match="called 0 time"):
        fake.assert_called(1)


# ------------------------------------------------------------------ checks, approval, files


def test_an_invalid_flow_raises_before_running_unless_told_not_to() -> None:
    needs = Flow(name="needs", description="Nothing provides 'price'.",
                 steps=[FlowStep("quote", id="first"), FlowStep("quote", {"total_cents": "price"},
                                                    id="again")])
    fake = FakeTool(quote, {"cents": 1})
    with pytest.raises(FlowValidationError, match="context key 'price'"):
        run_flow(needs, {"total_cents": 5}, tools=[fake])
    assert fake.calls == []
    run = run_flow(needs, {"total_cents": 5}, tools=[fake], check=False)
    run.assert_failed(step="again")
    assert fake.calls == [{"total_cents": 5}]


def test_approval_is_given_unless_a_hook_refuses() -> None:
    flow = Flow(name="pay", description="Charge.", steps=[FlowStep("charge")])
    fake = FakeTool(charge, {"charged": 3})
    run_flow(flow, {"cents": 3}, tools=[fake]).assert_output({"charged": 3})
    refused = run_flow(flow, {"cents": 3}, tools=[fake], approve=lambda request: False)
    refused.assert_failed("ApprovalDenied")
    assert fake.call_count == 1


def test_flow_files_and_sub_flows_run(tmp_path: Path) -> None:
    (tmp_path / "inner.flow.yaml").write_text("name: inner\ndescription: I.\n"
                                              "steps: [find_order]\n")
    outer = tmp_path / "outer.flow.json"
    outer.write_text('{"name": "outer", "description": "O.", "steps": '
                     '[{"flow": "inner"}, "quote"]}')
    lookup = FakeTool(find_order, {"order_id": "A-1", "total_cents": 40})
    run = run_flow(str(outer), {"order_id": "A-1"}, flows=[tmp_path / "inner.flow.yaml"],
                   tools=[lookup, FakeTool(quote, {"cents": 4})])
    run.assert_output({"cents": 4})
    run.assert_step("inner/find_order", status="completed", outputs={"order_id": "A-1",
                                                                     "total_cents": 40})


# ------------------------------------------------------------------ the kit and fixture


def test_the_kit_uses_modules_and_fakes_win(flow_kit: FlowKit) -> None:
    module = type(sys)("shop_tools")
    module.find_order, module.quote, module._hidden = find_order, quote, charge
    flow_kit.use(module)
    fake = flow_kit.fake(quote, {"cents": 7})
    flow_kit.use(quote)  # a real tool added later does not replace the fake
    flow_kit.run(FLOW, {"order_id": "A-1"}).assert_output({"cents": 7})
    assert fake.call_count == 1
    with pytest.raises(FlowValidationError, match="charge"):
        flow_kit.run(Flow(name="pay", description="P.", steps=[FlowStep("charge")]), {})


def test_each_test_gets_a_fresh_kit(flow_kit: FlowKit) -> None:
    with pytest.raises(FlowValidationError, match="quote"):
        flow_kit.run(FLOW, {"order_id": "A-1"})


@pytest.mark.slow
def test_the_plugin_runs_the_documented_example_without_the_mcp_extra(tmp_path: Path
                                                                      ) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "testing.md").read_text(),
                        re.DOTALL)
    (example,) = [block for block in blocks if "def test_" in block]
    (tmp_path / "test_example.py").write_text(example)
    # pytest as an author runs it, in an environment where the MCP extra is missing.
    starter = ("import sys\nfor name in ('fastmcp', 'mcp', 'jsonschema'):\n"
               "    sys.modules[name] = None\n"
               "import pytest\nsys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
               "'test_example.py']))\n")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["chainweaver.testing_plugin"]\n')
    done = subprocess.run([sys.executable, "-c", starter], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_the_plugin_leaves_chainweaver_to_the_normal_importer() -> None:
    # pytest would load every module of a plugin's distribution with its assertion
    # rewriter, which cannot run `python -m chainweaver` through runpy.
    import chainweaver.cli.run

    assert type(chainweaver.cli.run.__loader__).__name__ != "AssertionRewritingHook"
