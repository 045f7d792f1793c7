"""What a step grant check costs (docs/step-grants.md), against runs with no guard.

1. **One check.** ``StepGuard.decide`` for one attempt of one step that declares
   ``--grants`` scopes (and as many claims), for a caller holding every one: the request
   built, the declared grants checked, the decision noted. Reported per check, p50 and
   p95 (the target: under 50 µs at p95 with 100 grants).
2. **A guarded run against a plain one.** The same 3-step flow run in-process with
   ``execute_flow``, plain (no declaration, no hook: no guard) and with each tool
   declaring one scope and a caller holding it; turns taken in chunks, so noise hits
   both. The ratio is the guard's whole cost per run.
3. **An approved guarded run against one approved without asking.** The guarded flow
   with its last tool requiring approval, run with an approval hook (the approval
   records the step-grant decisions it covers and each covered check compares with
   them: docs/step-grants.md, "Approval keeps its meaning") and with
   ``ALWAYS_APPROVE`` (nothing recorded). The ratio is what keeping approval's meaning
   costs per run.
"""

from __future__ import annotations

import argparse
import sys
import time

from pydantic import BaseModel

from chainweaver import (
    ALWAYS_APPROVE,
    Caller,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    Grants,
    ToolSafetyContract,
    tool,
)
from chainweaver.step_guard import StepGuard, fixed_caller

READ = ToolSafetyContract("read")


class Text(BaseModel):
    text: str


def one_check(grants: int, number: int) -> tuple[float, float]:
    scopes = frozenset(f"scope.{i}" for i in range(grants))
    claims = {f"claim_{i}": [f"value-{i}", "other"] for i in range(grants)}
    declared = Grants(scopes, claims)
    caller = Caller("bench", scopes, {name: values[0] for name, values in claims.items()})
    guard = StepGuard(fixed_caller(caller), None, "bench", "1.0.0")
    arguments = {"text": "hello", "count": 3}
    samples = []
    for _ in range(number):
        started = time.perf_counter()
        request = guard.request("step", "tool", "bench_tool", None, READ, arguments,
                                declared)
        refused = guard.decide(request)
        samples.append(time.perf_counter() - started)
        if refused is not None:
            sys.exit(f"the caller holds every grant, yet the check refused: {refused}")
        if len(guard.decisions.kept) >= 16:
            guard.decisions = type(guard.decisions)()  # keep memory flat
    samples.sort()
    return samples[len(samples) // 2] * 1e6, samples[int(len(samples) * 0.95)] * 1e6


def runs(number: int, rounds: int) -> tuple[float, float]:
    def build(requires: list[str] | None) -> FlowExecutor:
        executor = FlowExecutor(FlowRegistry())
        for name in ("clean", "count", "label"):
            @tool(name=name, safety=READ, requires=requires)
            def step(text: str) -> Text:
                return Text(text=text)
            executor.register_tool(step)
        executor.registry.register_flow(Flow("chain", "d", [
            FlowStep("clean"), FlowStep("count"), FlowStep("label")]))
        return executor

    plain, guarded = build(None), build(["bench"])
    caller = Caller("bench", {"bench"})
    timings: dict[str, list[float]] = {"plain": [], "guarded": []}
    for _ in range(rounds):
        for label, executor, who in (("plain", plain, None), ("guarded", guarded, caller)):
            started = time.perf_counter()
            for _ in range(number):
                result = executor.execute_flow("chain", {"text": "x"}, caller=who)
            timings[label].append((time.perf_counter() - started) / number)
            if not result.success:
                sys.exit(f"{label} run failed: {result.error}")
    return min(timings["plain"]) * 1e6, min(timings["guarded"]) * 1e6


def approved_runs(number: int, rounds: int) -> tuple[float, float]:
    executor = FlowExecutor(FlowRegistry())
    for name in ("clean", "count", "label"):
        safety = ToolSafetyContract("write", requires_approval=True) if name == "label" \
            else READ

        @tool(name=name, safety=safety, requires=["bench"])
        def step(text: str) -> Text:
            return Text(text=text)
        executor.register_tool(step)
    executor.registry.register_flow(Flow("chain", "d", [
        FlowStep("clean"), FlowStep("count"), FlowStep("label")]))
    caller = Caller("bench", {"bench"})

    def user(request: object) -> bool:
        return True

    timings: dict[str, list[float]] = {"unasked": [], "approved": []}
    for _ in range(rounds):
        for label, approve in (("unasked", ALWAYS_APPROVE), ("approved", user)):
            started = time.perf_counter()
            for _ in range(number):
                result = executor.execute_flow("chain", {"text": "x"}, caller=caller,
                                               approve=approve)
            timings[label].append((time.perf_counter() - started) / number)
            if not result.success:
                sys.exit(f"{label} run failed: {result.error}")
    return min(timings["unasked"]) * 1e6, min(timings["approved"]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grants", type=int, default=100)
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.number, args.runs, args.rounds = 500, 50, 2
    p50, p95 = one_check(args.grants, args.number)
    print(f"1. one check, {args.grants} scopes + {args.grants} claims held: "
          f"p50 {p50:.1f} µs, p95 {p95:.1f} µs (target: p95 < 50 µs)")
    plain, guarded = runs(args.runs, args.rounds)
    print(f"2. 3-step run, best of {args.rounds}: plain {plain:.1f} µs, with a grant per "
          f"tool {guarded:.1f} µs (ratio {guarded / plain:.2f}, "
          f"{(guarded - plain) / 3:.1f} µs per step)")
    unasked, approved = approved_runs(args.runs, args.rounds)
    print(f"3. the guarded run with an approval, best of {args.rounds}: ALWAYS_APPROVE "
          f"{unasked:.1f} µs, asked and recorded {approved:.1f} µs (ratio "
          f"{approved / unasked:.2f}, {approved - unasked:.1f} µs per run)")


if __name__ == "__main__":
    main()
