"""Approval at run time, and how a server's runs talk back (:class:`RunSettings`).

:class:`Approval` asks the user to approve a run before any step starts: through
elicitation on 2025-11-25, through an ``input_required`` result on 2026-07-28 (the
client retries the call with the answer, in a signed, single-use state bound to the
caller, the flow, its version, the covered steps and the arguments, and to the
step-grant decisions it was asked under). Every answer is audited.

A run whose step-grant decision changes after it was approved asks again
(:mod:`chainweaver.engine.approved`): by elicitation on 2025-11-25; a call that can only be
answered by retrying it (2026-07-28) or a background task's leg cannot hold its run
open for the answer, so the run stops before that step. A state whose decisions
changed before its answer arrived asks again, with a fresh state.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import mcp_types
from fastmcp import FastMCP
from fastmcp.server.context import Context
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field, StrictBool, ValidationError

from chainweaver.mcp.gate import admission
from chainweaver.run_events import ApprovalRequest

logger = logging.getLogger("chainweaver.mcp.runs.approval")

APPROVAL_KEY = "chainweaver_approval"  # the input request's key on 2026-07-28
STATE_VERSION = 3  # the layout of the signed approval state
MAX_USED_STATES = 100_000  # approval states remembered as used, per process


SharedMark = Callable[[str, float], Awaitable[bool | None]]


class ApprovalNonces:
    """Records each approval state as used, so it approves one retry only.

    By default in this process: a bounded record (at most ``limit`` states) kept until
    each state expires. When it is full, the state that expires first is forgotten and
    every state expiring no later than it is refused from then on, so a forgotten state
    can never be replayed. ``shared`` (a server with a task backend gives it:
    :func:`chainweaver.mcp.tasks.setup.approval_marks`) finds, for the server a call
    runs on, how to mark a state in a store every replica shares; it finds none while
    that store is not running, and the process record answers instead.
    """

    def __init__(self, limit: int = MAX_USED_STATES, *,
                 shared: Callable[[FastMCP], SharedMark | None] | None = None) -> None:
        self.limit = limit
        self.shared = shared
        self._used: dict[str, float] = {}
        self._expiries: list[tuple[float, str]] = []  # a heap: the next to expire first
        self._floor = 0.0  # states expiring at or before this are refused
        self._lock = threading.Lock()

    async def use(self, nonce: str, expires: float, server: FastMCP | None = None) -> bool:
        """Mark the state ``nonce`` (valid until ``expires``, a time.time()) as used on
        ``server`` (the one the call runs on); False when it was used already or can no
        longer be told apart from one that was."""
        mark = self.shared(server) if self.shared is not None and server is not None \
            else None
        if mark is not None:
            answer = await mark(nonce, expires)
            if answer is not None:
                return answer
        return self._use_here(nonce, expires)

    def _use_here(self, nonce: str, expires: float) -> bool:
        now = time.time()
        with self._lock:
            while self._expiries and self._expiries[0][0] < now:
                _, old = heapq.heappop(self._expiries)
                self._used.pop(old, None)
            if expires <= self._floor or nonce in self._used:
                return False
            self._used[nonce] = expires
            heapq.heappush(self._expiries, (expires, nonce))
            while len(self._used) > self.limit:
                dropped, old = heapq.heappop(self._expiries)
                self._used.pop(old, None)
                self._floor = max(self._floor, dropped)
            return True


@dataclass(frozen=True)
class RunSettings:
    """How a server's flow tools talk back during a run (one per server)."""

    approval: bool = False  # ask the user before a run whose steps need approval
    approval_timeout: float = 300.0  # seconds to wait for an elicitation answer
    notifications: bool = True  # per-step progress and log messages, when asked for
    # Sign the approval state handed to 2026-07-28 clients (the SDK also seals it): the
    # first signs, any verifies. Derived from the server's request-state keys when it
    # has them (replicas and workers then agree), else random per process.
    secrets: tuple[bytes, ...] = field(default_factory=lambda: (secrets.token_bytes(32),),
                                       repr=False)
    # Where an approval state is recorded as used (each is good for one retry): this
    # process, or the Redis of the server's tasks backend (see ApprovalNonces).
    nonces: ApprovalNonces = field(default_factory=lambda: ApprovalNonces(),
                                   repr=False, compare=False)
    # Step grants (chainweaver.grants): the server's step authorizer and how it learns
    # the caller as it is now (SecurityConfig).
    step_authorizer: Any = field(default=None, compare=False)
    refresh_caller: Any = field(default=None, compare=False)

    @classmethod
    def build(cls, approval: bool, approval_timeout: float,
              keys: tuple[bytes, ...] | None, notifications: bool = True, *,
              shared_nonces: Callable[[FastMCP], SharedMark | None] | None = None,
              step_authorizer: Any = None, refresh_caller: Any = None) -> RunSettings:
        """A server's settings; ``shared_nonces``: see :class:`ApprovalNonces`;
        ``step_authorizer`` and ``refresh_caller``: the server's step grants."""
        nonces = ApprovalNonces(shared=shared_nonces)
        steps = {"step_authorizer": step_authorizer, "refresh_caller": refresh_caller}
        if not keys:
            return cls(approval, approval_timeout, notifications, nonces=nonces, **steps)
        derived = tuple(hashlib.sha256(b"chainweaver/approval-state:" + key).digest()
                        for key in keys)
        return cls(approval, approval_timeout, notifications, derived, nonces, **steps)


class ApprovalAnswer(BaseModel):
    """The form a user fills in to approve a run."""

    # Strict: only a JSON true approves ("yes", "on", 1 would otherwise pass as True).
    approve: StrictBool = Field(title="Approve",
                                description="Run the flow, side effects included")


APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approve": {"type": "boolean", "title": "Approve",
                               "description": "Run the flow, side effects included"}},
    "required": ["approve"],
}


def approval_message(request: ApprovalRequest, tool_name: str, again: str | None = None
                     ) -> str:
    """The approval question: every step the approval covers (``request.steps``: each
    step that requires approval, a fallback or a sub-flow's step included), with its
    tool, side effects and reason, one a line; no step that needs no approval. Asked
    again (``request.changed``, or ``again``: why), the question says so first."""
    lines = []
    if request.changed is not None:
        lines.append(f"The run was approved, but the grant decision of step "
                     f"{request.changed!r} changed since; it asks again.")
    elif again is not None:
        lines.append(f"Asked again: {again}.")
    lines.append(f"Flow {tool_name!r} (version {request.flow_version}) asks approval to "
                 f"run {'this step' if len(request.steps) == 1 else 'these steps'}:")
    for step in request.steps:
        what = f"step {step.step_id!r} (tool {step.tool_name!r})" if not step.fallback \
            else (f"fallback of step {step.step_id!r} (tool {step.tool_name!r}, runs only "
                  f"if the step fails)")
        lines.append(f"- {what}: side effects {step.side_effects!r}; reason: "
                     f"{step.reason or 'none given'}")
    lines.append("Approve?")
    return "\n".join(lines)


def declared_elicitation(ctx: Context) -> bool:
    """The client declared the elicitation capability: its user can be asked."""
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and capabilities.elicitation is not None


@dataclass(frozen=True)
class ApprovalInTask:
    """How a run inside a background task asks for approval (``chainweaver.mcp.tasks.extension``).

    ``audit`` records the user's answer for a step (``step_id``, answer) in the task's
    audit; ``client_can_answer``: the client that created the task declared elicitation,
    so it can answer the ask through ``tasks/update``; ``caller_id``: the gate's caller
    that created the task (the approval state is bound to it).
    """

    audit: Callable[[str, str], Awaitable[None]]
    client_can_answer: bool
    caller_id: str | None = None  # the gate's caller that created the task


class Waiting(Protocol):
    """Told while a run waits for its user's answer (its run record, when kept)."""

    async def asking(self) -> None: ...

    async def answered(self) -> None: ...


class Approval:
    """The ``approve`` hook of one call: asks the client's user, audits the answer.

    On 2026-07-28 (and in a background task) the first round cannot wait for the
    user: it sets :attr:`ask` (an ``input_required`` result for the tool to return)
    and refuses. The client's retry carries the answer and the signed state; in a
    task, ``tasks/update`` carries the answer and the next leg reads both.

    The state is bound to the caller (as the gate knows it, under any authentication),
    the flow, its version, the step(s) approved and a digest of the arguments, expires
    after ``approval_timeout`` and approves one retry only (:class:`ApprovalNonces`).

    ``readmit`` is asked after an accept, before any step runs: the user may have
    taken a while, and the flow may have left the server or the caller's view
    meanwhile. When it says no, the run stops (``outcome`` ``"flow_unavailable"``).
    ``shown`` turns a request into what the user may be shown (a sub-flow outside the
    caller's view is not named).
    """

    def __init__(self, ctx: Context, tool_name: str, settings: RunSettings,
                 in_task: ApprovalInTask | None = None, *,
                 arguments: Mapping[str, Any] | None = None,
                 readmit: Callable[[], bool] | None = None,
                 shown: Callable[[ApprovalRequest], ApprovalRequest] | None = None,
                 waiting: Waiting | None = None, owner: str | None = None) -> None:
        self._ctx = ctx
        self._owner = owner  # the owner mark of the gate whose caller is asked
        self._waiting = waiting  # told while the user is asked (the run's record)
        self._name = tool_name
        self._settings = settings
        self._in_task = in_task
        self._arguments = arguments_digest(arguments)
        self._readmit = readmit
        self._shown = shown
        self.ask: mcp_types.InputRequiredResult | None = None
        self._again: str | None = None  # why the question is asked again, if it is
        self.outcome = "not_asked"  # accept, decline, cancel, no_answer, unavailable, ...
        self.request: ApprovalRequest | None = None  # what the run asked approval for

    async def __call__(self, request: ApprovalRequest) -> bool:
        self.request = request
        ctx = self._ctx
        rc = ctx.request_context
        retried = self._in_task is not None or (
            rc is not None and rc.protocol_version in MODERN_PROTOCOL_VERSIONS)
        answer: str | None
        if request.changed is not None and retried:
            # Asked again mid-run: the answer could only come with a retry of the call
            # (or the task's next leg), which cannot continue this run: it stops here.
            answer = "unavailable"
        elif retried:
            answer = await self._from_retry(request)
        else:
            answer = await self._elicit(request)
        if answer is None:  # asked through input_required: decided on the retry
            return False
        if answer == "accept" and self._readmit is not None and not self._readmit():
            # Admitted again after the wait: the flow version left the server's current
            # snapshot or the caller's view while the user was deciding.
            answer = "flow_unavailable"
        self.outcome = answer
        if self._in_task is not None:
            await self._in_task.audit(request.step_id, answer)
        else:
            held = admission.current()  # the tools/call's: audited as the gate admitted it
            if held is not None and held.audit_approval is not None:
                await held.audit_approval(request.step_id, answer)
        return answer == "accept"

    def shown(self, request: ApprovalRequest) -> ApprovalRequest:
        """``request`` as the caller's user may see it."""
        return self._shown(request) if self._shown is not None else request

    def _message(self, request: ApprovalRequest) -> str:
        return approval_message(self.shown(request), self._name, self._again)

    async def _elicit(self, request: ApprovalRequest) -> str:
        """Ask over the 2025-11-25 back-channel; the answer as an outcome word."""
        ctx = self._ctx
        session = ctx.session
        capability = mcp_types.ClientCapabilities(elicitation=mcp_types.ElicitationCapability())
        if not session.check_client_capability(capability):
            return "unavailable"  # the client declared no elicitation capability
        if not session.can_send_request:
            return "unavailable"  # stateless HTTP: no channel for a server request
        if self._waiting is not None:
            await self._waiting.asking()
        try:
            result = await asyncio.wait_for(
                ctx.elicit(self._message(request), ApprovalAnswer),
                self._settings.approval_timeout)
        except TimeoutError:
            return "no_answer"
        except Exception as error:  # the client failed or refused to ask
            logger.info("approval elicitation failed: %s", type(error).__name__)
            return "no_answer"
        finally:
            if self._waiting is not None:
                await self._waiting.answered()
        if result.action != "accept":
            return result.action  # decline or cancel
        data = getattr(result, "data", None)
        return "accept" if isinstance(data, ApprovalAnswer) and data.approve else "decline"

    async def _from_retry(self, request: ApprovalRequest) -> str | None:
        """The answer on a 2026-07-28 retry; None after asking (``ask`` is set)."""
        ctx = self._ctx
        state = ctx.request_state
        if state is None:
            return self._asking(request)
        # A background task's state never leaves the server (fastmcp-tasks keeps it with
        # the task; the client answers by key, and a task takes one answer), and the
        # next leg may run on a worker with other secrets: there only the binding is
        # checked. A state a client echoes is checked whole, then used up.
        in_task = self._in_task is not None
        verdict = await self._verify(state, request, signed=not in_task, use=not in_task)
        if verdict == "changed":
            # Answered, but asked under step-grant decisions (or for a caller) that are
            # not those of now (a task resumed after a grant changed, say): the answer
            # is not for this run as it stands. Nothing ran: ask again.
            self._again = "the grant decisions of its steps changed since it was asked"
            return self._asking(request)
        if verdict != "ok":
            return "invalid_state"
        response = (ctx.input_responses or {}).get(APPROVAL_KEY)
        if not isinstance(response, mcp_types.ElicitResult):
            return "no_answer"
        if response.action != "accept":
            return response.action
        try:
            answer = ApprovalAnswer.model_validate(response.content or {})
        except ValidationError:
            return "decline"
        return "accept" if answer.approve else "decline"

    def _asking(self, request: ApprovalRequest) -> str | None:
        """Ask through an ``input_required`` result (:attr:`ask`); None once asked."""
        if not self._can_ask():
            return "unavailable"
        self.ask = mcp_types.InputRequiredResult(
            input_requests={APPROVAL_KEY: mcp_types.ElicitRequest(
                params=mcp_types.ElicitRequestFormParams(
                    message=self._message(request), requested_schema=APPROVAL_SCHEMA))},
            request_state=self._mint(request))
        return None

    def _can_ask(self) -> bool:
        if self._in_task is not None:
            return self._in_task.client_can_answer  # through tasks/update
        return declared_elicitation(self._ctx)

    def _caller(self) -> str:
        if self._in_task is not None and self._in_task.caller_id is not None:
            return self._in_task.caller_id
        return admission.caller(self._owner).id

    def _binding(self, request: ApprovalRequest) -> str:
        """What a state approves (who, which flow version, which steps, which input), as
        a digest: the state names nothing, not even to a server that could unseal it."""
        text = json.dumps([self._caller(), request.flow_name, request.flow_version,
                           list(request.step_ids), self._arguments],
                          separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    @staticmethod
    def _decisions(request: ApprovalRequest) -> str:
        """The step-grant decisions (and the caller) a question was asked under, as a
        digest (``"-"``: the run has no step grants)."""
        if not request.grants and request.caller_id is None:
            return "-"
        text = json.dumps([request.caller_id, [list(g) for g in request.grants]],
                          separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    # The SDK seals request_state and binds it to the tool, the arguments and an OAuth
    # caller; this signature also binds it to the gate's caller (any authentication),
    # the flow version, the step(s) and the arguments, and gives it a single use, so
    # the state of another caller, flow, step, input or server never approves this one.
    def _mint(self, request: ApprovalRequest) -> str:
        expires = round(time.time() + self._settings.approval_timeout, 3)
        body = json.dumps([STATE_VERSION, self._binding(request), self._decisions(request),
                           secrets.token_hex(16), expires], separators=(",", ":"))
        return f"{body}|{self._sign(body)}"

    async def _verify(self, state: str, request: ApprovalRequest, *, signed: bool = True,
                      use: bool = False) -> str | None:
        """``"ok"`` when ``state`` approves ``request`` here (``use``: and has not
        approved anything before, then is used up, and has not expired);
        ``"changed"`` when it would, but was asked under other step-grant decisions
        (used up all the same); None when it does not approve it."""
        body, _, signature = state.rpartition("|")
        if signed and not any(
                hmac.compare_digest(signature, self._sign(body, secret))
                for secret in self._settings.secrets):
            return None
        try:
            layout, binding, decisions, nonce, expires = json.loads(body)
        except (ValueError, TypeError):
            return None
        if layout != STATE_VERSION or binding != self._binding(request) \
                or not isinstance(nonce, str) or isinstance(expires, bool) \
                or not isinstance(expires, (int, float)):
            return None
        verdict = "ok" if decisions == self._decisions(request) else "changed"
        if not use:
            return verdict
        if expires < time.time():
            return None
        try:
            server: FastMCP | None = self._ctx.fastmcp
        except RuntimeError:  # the server is gone: the process record answers
            server = None
        used = await self._settings.nonces.use(nonce, float(expires), server)
        return verdict if used else None

    def _sign(self, body: str, secret: bytes | None = None) -> str:
        key = self._settings.secrets[0] if secret is None else secret
        return hmac.new(key, body.encode("utf-8"), hashlib.sha256).hexdigest()


def arguments_digest(arguments: Mapping[str, Any] | None) -> str:
    """SHA-256 of the arguments as canonical JSON (sorted keys, no spaces)."""
    try:
        text = json.dumps(arguments or {}, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False, allow_nan=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        text = repr(arguments)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
