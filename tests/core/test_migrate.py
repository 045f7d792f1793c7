"""`chainweaver migrate`, in process: the reference-format corpus in tests/cli/migrate_corpus
converts, every inexpressible field is reported with its file and path, only valid results
are written, and the converted flows run and give the results the reference package gave
(recorded in tests/cli/migrate_corpus_expected.json). tests/cli/test_migrate_cli.py runs
the installed command."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from support import migrate_corpus

from chainweaver import FlowExecutor, FlowRegistry, load_flows
from chainweaver.cli import main
from chainweaver.conditions import Condition
from chainweaver.migrate import MigrationError, convert

HERE = Path(__file__).resolve().parents[1] / "cli"
CORPUS = HERE / "migrate_corpus"
EXPECTED = json.loads((HERE / "migrate_corpus_expected.json").read_text())
WRITTEN = ["label_wrapper.flow.json", "order_label.flow.yaml", "refund_case.flow.yaml",
           "routing.flow.json"]
# (source file, field) of everything the corpus holds that ChainWeaver cannot express.
INEXPRESSIBLE = [
    ("capability_dag.flow.json", "steps[1].step_type"),
    ("capability_dag.flow.json", "steps[1].capability_id"),
    ("capability_dag.flow.json", "steps[0].branches[0].predicate"),
    ("legacy.flow.yaml", "notes"),
    ("legacy.flow.yaml", "status"),
    ("legacy.flow.yaml", "trigger_conditions"),
    ("legacy.flow.yaml", "context_schema_ref"),
    ("legacy.flow.yaml", "capability_id"),
    ("legacy.flow.yaml", "dynamic_params"),
    ("legacy.flow.yaml", "on_context_collision"),
    ("legacy.flow.yaml", "governance.lifecycle"),
    ("legacy.flow.yaml", "governance.reviewed_by"),
    ("legacy.flow.yaml", "safety.stability"),
    ("legacy.flow.yaml", "steps[0].decision_candidates"),
    ("legacy.flow.yaml", "steps[0].input_contract"),
    ("legacy.flow.yaml", "steps[1].retry.backoff_multiplier"),
]


def migrate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["migrate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def findings(err: str) -> list[tuple[str, str]]:
    """(file name, field) of each reported field (lines 'FILE: FIELD: why')."""
    found = []
    for line in err.splitlines():
        source, _, rest = line.partition(": ")
        field, _, _ = rest.partition(": ")
        if source.startswith(str(CORPUS)) and field != "not written":
            found.append((Path(source).name, field))
    return found


def executor_for(directory: Path) -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    for t in migrate_corpus.chainweaver_tools():
        executor.register_tool(t)
    for flow in load_flows(directory, tools=executor.tools):
        executor.registry.register_flow(flow)
    return executor


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("converted")
    assert main(["migrate", str(CORPUS), "--out", str(out)]) == 1
    return out


# ------------------------------------------------------------------ the report


def test_the_corpus_is_converted_and_every_left_out_field_is_reported(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = migrate(capsys, str(CORPUS), "--out", str(tmp_path / "out"))
    assert code == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == WRITTEN
    assert out.splitlines() == [f"{CORPUS / name} -> {tmp_path / 'out' / name}"
                                for name in WRITTEN]
    assert sorted(findings(err)) == sorted(INEXPRESSIBLE)
    assert f"{CORPUS / 'legacy.flow.yaml'}: not written: 13 field(s) cannot be expressed " \
           "(--partial writes the rest)" in err
    assert f"{CORPUS / 'not_a_flow.json'}: not written: not a reference flow: type: must " \
           "be 'Flow' or 'DAGFlow', got 'Pipeline'" in err
    assert f"{CORPUS / 'two_ends.flow.yaml'}: not written: the converted flow does not " \
           "load: steps: flow 'two_ends': steps 'a', 'b' all end the flow" in err
    assert err.splitlines()[-1] == f"chainweaver migrate: 4 of 8 file(s) written to " \
                                   f"{tmp_path / 'out'}"


def test_partial_writes_what_is_expressible_and_still_exits_1(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = migrate(capsys, str(CORPUS / "legacy.flow.yaml"),
                             str(CORPUS / "capability_dag.flow.json"), "--out",
                             str(tmp_path), "--partial")
    assert code == 1
    assert "legacy.flow.yaml without 13 field(s)" in out
    legacy = yaml.safe_load((tmp_path / "legacy.flow.yaml").read_text())
    assert legacy == {
        "name": "legacy_pipeline", "version": "0.1.0",
        "description": "Uses everything that has no counterpart.",
        "governance": {"lifecycle": "draft"},  # 'suggested': never published unreviewed
        "safety": {"side_effects": "read", "idempotent": True},
        "steps": [{"tool": "lookup_order"},
                  {"tool": "add", "input_mapping": {"value": {"pointer": "/order/total"},
                                                    "amount": {"const": 1}},
                   "retry": {"max_attempts": 4, "backoff_seconds": 0.5,
                             "max_backoff_seconds": 2.0, "retry_on": ["Exception"]}}]}
    dag = json.loads((tmp_path / "capability_dag.flow.json").read_text())
    assert [step.get("when") for step in dag["steps"]] == [None, None]
    assert len(findings(err)) == 16  # 13 in legacy.flow.yaml, 3 in capability_dag


def test_a_clean_source_exits_0(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = migrate(capsys, str(CORPUS / "routing.flow.json"), "--out",
                             str(tmp_path / "new" / "dir"))
    assert (code, out) == (0, f"{CORPUS / 'routing.flow.json'} -> "
                              f"{tmp_path / 'new' / 'dir' / 'routing.flow.json'}\n")
    assert err == f"chainweaver migrate: 1 of 1 file(s) written to {tmp_path / 'new' / 'dir'}\n"


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = [([str(tmp_path / "missing.yaml"), "--out", str(tmp_path)], "missing.yaml: no "
              "such file or directory"),
             ([str(tmp_path / "empty"), "--out", str(tmp_path)], "no .yaml, .yml or .json "
              "files in this directory"),
             ([str(CORPUS / "routing.flow.json"), "--out", str(tmp_path / "file")],
              "file: not a directory")]
    for argv, words in cases:
        code, _, err = migrate(capsys, *argv)
        assert code == 2 and words in err and err.count("\n") == 1
    for argv in ([], [str(CORPUS)]):  # no source; no --out
        with pytest.raises(SystemExit) as caught:
            main(["migrate", *argv])
        assert caught.value.code == 2


def test_a_second_run_into_the_source_directory_reads_only_the_sources(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shutil.copy(CORPUS / "routing.flow.json", tmp_path / "routing.flow.json")
    for _ in range(2):
        code, out, _ = migrate(capsys, str(tmp_path), "--out", str(tmp_path / "converted"))
        assert (code, out) == (0, f"{tmp_path / 'routing.flow.json'} -> "
                                  f"{tmp_path / 'converted' / 'routing.flow.json'}\n")


def test_bad_files_and_name_clashes_are_reported_not_written(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(CORPUS / "routing.flow.json", tmp_path / "a" / "same.json")
    shutil.copy(CORPUS / "routing.flow.json", tmp_path / "b" / "same.json")
    (tmp_path / "a" / "broken.yaml").write_text("name: [\n")
    (tmp_path / "a" / "anchors.yaml").write_text("a: &x 1\nb: *x\n")
    code, _, err = migrate(capsys, str(tmp_path / "a"), str(tmp_path / "b"), "--out",
                           str(tmp_path / "out"))
    assert code == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["same.flow.json"]
    assert f"{tmp_path / 'b' / 'same.json'}: not written: {tmp_path / 'out'}/same.flow.json" \
           f" is already written for {tmp_path / 'a' / 'same.json'}" in err
    assert f"{tmp_path / 'a' / 'broken.yaml'}: not written: invalid YAML at line 2" in err
    assert "anchors.yaml: not written: not allowed at line 1, column 4: YAML anchors" in err


def test_a_bad_file_is_reported_and_the_batch_goes_on(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # A version past Python's 4300-digit limit once aborted the batch with a traceback:
    # the valid file after it was neither converted nor reported.
    source = json.loads((CORPUS / "routing.flow.json").read_text())
    (tmp_path / "a_long.json").write_text(json.dumps({**source,
                                                      "version": "1." + "9" * 5000 + ".0"}))
    shutil.copy(CORPUS / "routing.flow.json", tmp_path / "b_next.json")
    out = tmp_path / "out"
    code, stdout, err = migrate(capsys, str(tmp_path), "--out", str(out))
    assert code == 1
    assert f"{tmp_path / 'a_long.json'}: not written: the converted flow does not load: " \
           "version: version '1.99999999999999999999999999999999999...' is 5004 characters " \
           "long; at most 256 are allowed" in err
    assert stdout == f"{tmp_path / 'b_next.json'} -> {out / 'b_next.flow.json'}\n"
    assert sorted(p.name for p in out.iterdir()) == ["b_next.flow.json"]
    assert "1 of 2 file(s) written" in err and "Traceback" not in err


def test_a_file_that_cannot_be_written_is_reported_and_the_batch_goes_on(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shutil.copy(CORPUS / "routing.flow.json", tmp_path / "a_blocked.json")
    shutil.copy(CORPUS / "routing.flow.json", tmp_path / "b_next.json")
    out = tmp_path / "out"
    (out / "a_blocked.flow.json").mkdir(parents=True)  # a directory where the file goes
    code, stdout, err = migrate(capsys, str(tmp_path / "a_blocked.json"),
                                str(tmp_path / "b_next.json"), "--out", str(out))
    assert code == 1
    assert f"{tmp_path / 'a_blocked.json'}: not written: {out / 'a_blocked.flow.json'} " \
           "cannot be written: Is a directory" in err
    assert stdout == f"{tmp_path / 'b_next.json'} -> {out / 'b_next.flow.json'}\n"


# ------------------------------------------------------------------ the conversions


def test_each_construct_converts_to_its_chainweaver_form(converted: Path) -> None:
    order = yaml.safe_load((converted / "order_label.flow.yaml").read_text())
    assert order["input_schema"] == "support.migrate_corpus:OrderRequest"
    assert order["governance"] == {"owner": "shop-team"}
    ids = [(step.get("id"), step["tool"]) for step in order["steps"]]
    assert ids[2:4] == [("add", "add"), ("add_2", "add")]  # a tool used twice needs ids
    shipping = order["steps"][1]
    assert shipping["input_mapping"] == {"city": {"pointer": "/order/customer/address/city"},
                                         "express": {"const": False}, "weight": {"const": 3}}
    assert shipping["retry"] == {"max_attempts": 3, "backoff_seconds": 0.01,
                                 "max_backoff_seconds": 0.02, "retry_on": ["ConnectionError"]}
    assert order["steps"][3]["output_mapping"] == {"grand_total": "value"}
    assert (order["steps"][4]["on_error"], order["steps"][4]["fallback"]) == (
        "fallback", "no_discount")
    assert order["steps"][5]["on_error"] == "skip"
    routing = json.loads((converted / "routing.flow.json").read_text())
    assert routing["output_schema"] == "support.migrate_corpus:RouteSummary"
    assert [(s["id"], s["after"], s.get("when")) for s in routing["steps"]][:5] == [
        ("probe", [], None),
        ("fast", ["probe"], "cache_hit == True"),
        ("bulk", ["probe"], "(size > 10) and not (cache_hit == True)"),
        ("slow", ["probe"], "not ((cache_hit == True) or (size > 10))"),
        ("notify", ["bulk"], "(size > 10) and not (cache_hit == True)"),  # skip propagates
    ]
    wrapper = json.loads((converted / "label_wrapper.flow.json").read_text())
    assert wrapper["steps"][0] == {"flow": "order_label", "input_mapping": {
        "order_id": "id", "currency": "currency"}}
    assert wrapper["steps"][1]["input_mapping"]["options"] == {
        "const": {"wrap": True, "note": None}}


@pytest.mark.parametrize("case", EXPECTED, ids=lambda case: f"{case['flow']}-"
                         f"{'-'.join(map(str, case['input'].values()))}")
def test_converted_flows_give_the_reference_results(converted: Path,
                                                   case: dict[str, Any]) -> None:
    executor = executor_for(converted)
    flow = executor.registry.get_flow(case["flow"])
    assert executor.check_flow(flow) == []
    for lane in ("sync", "async"):
        migrate_corpus.CALLS.clear()
        result = (executor.execute_flow(case["flow"], case["input"]) if lane == "sync" else
                  asyncio.run(executor.execute_flow_async(case["flow"], case["input"])))
        assert result.success, result.error
        # The reference returns its whole context; ChainWeaver the last step's output
        # (or the output schema's fields): the same values, fewer of them.
        reference = case["reference_output"]
        assert result.final_output
        assert result.final_output == {k: reference[k] for k in result.final_output}
        statuses: dict[str, list[str]] = {}
        for record in result.steps:
            statuses.setdefault(record.tool_name, []).append(record.status)
        assert statuses == case["reference_steps"]


def test_the_retried_and_fallback_steps_keep_their_reference_behaviour(
        converted: Path) -> None:
    migrate_corpus.CALLS.clear()
    result = executor_for(converted).execute_flow("order_label", {"order_id": "o-1"})
    records = {record.step_id: record for record in result.steps}
    assert records["shipping"].attempts == 2  # failed once with ConnectionError
    assert [e.type for e in records["shipping"].attempt_errors] == ["ConnectionError"]
    assert records["discount"].fallback == "no_discount"
    assert records["audit"].status == "skipped" and records["audit"].error is not None


@pytest.mark.parametrize("default", [None, "t2", "d"])
def test_branch_conditions_select_like_the_reference(default: str | None) -> None:
    """Every truth assignment: the first edge that holds picks its target, else the
    default, else every dependent runs."""
    edges = [("t1", "a"), ("t2", "b"), ("t1", "c")]
    steps = [{"step_id": "s", "tool_name": "x", "depends_on": [], "default_next": default,
              "branches": [{"target_step_id": t, "predicate": p} for t, p in edges]}]
    steps += [{"step_id": name, "tool_name": "x", "depends_on": ["s"]}
              for name in ("t1", "t2", "d", "e")]
    out, found = convert({"type": "DAGFlow", "name": "n", "version": "1",
                          "description": "d", "steps": steps})
    assert found == []
    conditions = {step["id"]: Condition(step["when"]) if "when" in step else None
                  for step in out["steps"][1:]}
    for values in itertools.product([False, True], repeat=3):
        context = dict(zip("abc", values, strict=True))
        picked = next((t for t, p in edges if context[p]), default)
        for name, condition in conditions.items():
            runs = condition is None or condition.evaluate(context)
            assert runs == (picked in (None, name)), (default, context, name)


def test_retry_policies_convert_within_chainweaver_limits() -> None:
    def retry_of(policy: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        out, found = convert({"name": "n", "description": "d", "steps": [
            {"tool_name": "t", "retry": policy}]})
        return out["steps"][0]["retry"], [f.field for f in found]

    assert retry_of({}) == ({"max_attempts": 4, "backoff_seconds": 1.0,
                             "max_backoff_seconds": 4.0, "retry_on": ["Exception"]}, [])
    assert retry_of({"max_retries": 0, "jitter": True,
                     "retryable_errors": ["pkg.mod:Busy"]}) == (
        {"max_attempts": 1, "backoff_seconds": 1.0, "max_backoff_seconds": 1.0,
         "jitter": 0.5, "retry_on": ["pkg.mod:Busy"]}, [])
    policy, found = retry_of({"max_retries": 150, "backoff_seconds": 5000})
    assert policy["max_attempts"] == 100 and policy["max_backoff_seconds"] == 3600
    assert found == ["steps[0].retry.max_retries", "steps[0].retry.backoff_seconds"]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5)
                    | st.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=12)
STEP_KEYS = st.sampled_from(["tool_name", "flow_name", "step_id", "depends_on", "branches",
                             "default_next", "input_mapping", "output_mapping", "retry",
                             "on_error", "decision_candidates", "step_type"])


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from(["Flow", "DAGFlow", None, 3]),
       steps=st.lists(st.dictionaries(STEP_KEYS, JSON, max_size=6), max_size=4),
       extra=st.dictionaries(st.sampled_from(["governance", "safety", "version", "status"]),
                             JSON, max_size=2))
def test_any_content_converts_or_is_refused_with_where(kind: Any, steps: list[Any],
                                                       extra: dict[str, Any]) -> None:
    data = {"type": kind, "name": "n", "description": "d", "steps": steps, **extra}
    try:
        out, found = convert(data)
    except MigrationError as error:
        assert str(error)
        return
    assert isinstance(out, dict) and all(f.field and f.message for f in found)
