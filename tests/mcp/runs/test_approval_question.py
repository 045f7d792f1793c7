"""The approval question shows every step the approval covers, and no other.

Through a real in-memory MCP client on both protocol eras: on 2025-11-25 the question
is the elicitation's message; on 2026-07-28 it is the message of the ``ElicitRequest``
in the ``input_required`` result. A flow whose first step reads personal data and
whose later step deletes the account (both need approval) names both, each with its
tool, side effects and reason; its step that needs no approval is not named.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult
from pydantic import BaseModel
from support.mcp_client import raw_call

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import ExposurePolicy, FlowServer
from chainweaver.mcp.runs.approval import APPROVAL_KEY

ERAS = ["legacy", "auto"]  # 2025-11-25, 2026-07-28
RAN: list[str] = []


class Account(BaseModel):
    account_id: str


@tool(safety=ToolSafetyContract("read", requires_approval=True,
                                approval_reason="reads personal data"))
def read_profile(account: Account) -> Account:
    RAN.append("read_profile")
    return account


@tool(safety=ToolSafetyContract("read"))
def summarize(account: Account) -> Account:
    RAN.append("summarize")
    return account


@tool(safety=ToolSafetyContract("write", requires_approval=True,
                                approval_reason="deletes the account"))
def delete_account(account: Account) -> Account:
    RAN.append("delete_account")
    return account


@tool(safety=ToolSafetyContract("read"))
def export_data(account: Account) -> Account:
    RAN.append("export_data")
    raise ConnectionError("archive unavailable")


@tool(safety=ToolSafetyContract("write", requires_approval=True,
                                approval_reason="mails the data to the user"))
def mail_export(account: Account) -> Account:
    RAN.append("mail_export")
    return account


def build_server() -> FlowServer:
    RAN.clear()
    executor = FlowExecutor(FlowRegistry())
    for t in (read_profile, summarize, delete_account, export_data, mail_export):
        executor.register_tool(t)
    register = executor.registry.register_flow
    register(Flow("close_account", "Read, summarize, delete.",
                  [FlowStep("read_profile"), FlowStep("summarize"),
                   FlowStep("delete_account")]))
    register(Flow("erase", "Delete an account.", [FlowStep("delete_account")]))
    register(Flow("offboard", "Summarize, export (mail it if that fails), erase.",
                  [FlowStep("summarize"),
                   FlowStep("export_data", on_error="fallback", fallback="mail_export"),
                   FlowStep(flow="erase", id="cleanup")]))
    policy = ExposurePolicy(allowed_side_effects=["none", "read", "write"], approval="elicit")
    return FlowServer(executor, policy=policy)


ARGUMENTS = {"account_id": "u-1"}


def covered_lines(question: str) -> list[str]:
    """The question's lines that name a step."""
    return [line for line in question.splitlines() if line.startswith("- ")]


async def ask(mode: str, tool_name: str, answer: Any) -> tuple[str, Any]:
    """Call ``tool_name`` and answer its approval question: (the question, the result)."""
    server = build_server()
    asked: list[str] = []

    async def on_elicit(message: str, response_type: Any, params: Any, context: Any) -> Any:
        asked.append(message)
        return answer

    async with Client(server.fastmcp, mode=mode, elicitation_handler=on_elicit) as client:
        if mode == "legacy":
            result = await client.call_tool(tool_name, ARGUMENTS, raise_on_error=False)
            (question,) = asked
            return question, result
        # 2026-07-28: the first round is input_required and runs nothing.
        call = {"name": tool_name, "arguments": ARGUMENTS}
        first = await raw_call(client, call)
        assert first["resultType"] == "input_required" and RAN == []
        request = first["inputRequests"][APPROVAL_KEY]
        assert request["method"] == "elicitation/create"
        question = request["params"]["message"]
        content = answer.content if isinstance(answer, ElicitResult) else answer
        action = answer.action if isinstance(answer, ElicitResult) else "accept"
        response = {"action": action, **({"content": content} if content else {})}
        result = await raw_call(client, {**call, "requestState": first["requestState"],
                                         "inputResponses": {APPROVAL_KEY: response}})
        return question, result


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_the_question_names_the_read_and_the_later_delete(mode: str) -> None:
    question, _ = await ask(mode, "close_account", {"approve": True})
    assert covered_lines(question) == [
        "- step 'read_profile' (tool 'read_profile'): side effects 'read'; "
        "reason: reads personal data",
        "- step 'delete_account' (tool 'delete_account'): side effects 'write'; "
        "reason: deletes the account",
    ]
    assert "summarize" not in question  # needs no approval: not covered, not shown
    assert question.startswith("Flow 'close_account' (version 1.0.0)")
    assert question.endswith("Approve?")
    assert RAN == ["read_profile", "summarize", "delete_account"]  # approved: all ran


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_declining_the_question_runs_no_step(mode: str) -> None:
    question, result = await ask(mode, "close_account", {"approve": False})
    assert len(covered_lines(question)) == 2
    is_error = result.is_error if mode == "legacy" else result.get("isError")
    assert is_error and RAN == []


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_a_fallback_and_a_sub_flows_step_are_named_where_they_run(mode: str) -> None:
    question, _ = await ask(mode, "offboard", ElicitResult(action="decline"))
    assert covered_lines(question) == [
        "- fallback of step 'export_data' (tool 'mail_export', runs only if the step "
        "fails): side effects 'write'; reason: mails the data to the user",
        "- step 'cleanup/delete_account' (tool 'delete_account'): side effects 'write'; "
        "reason: deletes the account",
    ]
    assert "summarize" not in question and "'export_data' (tool 'export_data')" not in question
    assert RAN == []


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_an_operator_who_publishes_without_asking_runs_without_asking(mode: str) -> None:
    # allow_requires_approval is the operator's explicit, visible opt-out: nobody is
    # asked, and the run is not refused for want of an approval hook.
    RAN.clear()
    executor = FlowExecutor(FlowRegistry())
    for t in (read_profile, summarize, delete_account):
        executor.register_tool(t)
    executor.registry.register_flow(Flow("close_account", "Read, summarize, delete.", [
        FlowStep("read_profile"), FlowStep("summarize"), FlowStep("delete_account")]))
    server = FlowServer(executor, policy=ExposurePolicy(
        allowed_side_effects=["none", "read", "write"], allow_requires_approval=True))
    asked: list[str] = []

    async def elicit(message: str, *args: Any) -> Any:
        asked.append(message)
        return ElicitResult(action="decline")

    async with Client(server.fastmcp, mode=mode, elicitation_handler=elicit) as client:
        result = await client.call_tool("close_account", {"account_id": "7"})
    assert not result.is_error
    assert RAN == ["read_profile", "summarize", "delete_account"] and asked == []
