"""retry_on names must resolve when a policy is defined or a file is loaded: a built-in
exception name, an exception class, or an importable path to one. A misspelt name is a
definition error naming the field, never a policy that silently never retries."""

from __future__ import annotations

import builtins
import dataclasses
import json
import keyword
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chainweaver import DefinitionError, FlowFileError, load_flows
from chainweaver.engine.step_failures import SubFlowFailed
from chainweaver.files import flow_from_data
from chainweaver.flow_format import CLASS_NAME_PATTERN, flow_file_schema
from chainweaver.retry import RetryPolicy, exception_class

BUILTIN_EXCEPTIONS = sorted(
    name for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException))


@pytest.fixture
def errors_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An importable module with exception classes and a non-exception."""
    (tmp_path / "shop_errors.py").write_text(
        "class CarrierDown(Exception):\n    pass\n\n"
        "class CarrierTimeout(CarrierDown):\n    pass\n\n"
        "class ConnectionError(Exception):  # same name as the built-in\n    pass\n\n"
        "class Nested:\n    class Inner(RuntimeError):\n        pass\n\n"
        "NOT_A_CLASS = 5\n")
    (tmp_path / "broken_errors.py").write_text("raise RuntimeError('no database')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "shop_errors"
    for name in ("shop_errors", "broken_errors"):
        sys.modules.pop(name, None)


def flow_data(retry_on: object, index: int = 1) -> dict:
    steps: list = ["find_order"] * index
    steps.append({"tool": "track_parcel", "retry": {"retry_on": retry_on}})
    return {"name": "ping", "description": "d", "steps": steps}


# ------------------------------------------------------------------ what resolves


@pytest.mark.parametrize("name", BUILTIN_EXCEPTIONS)
def test_every_built_in_exception_name_is_accepted_and_retries_its_class(name: str) -> None:
    cls = getattr(builtins, name)
    policy = RetryPolicy(retry_on=[name])
    assert policy.retry_on == (name,)
    if cls.__init__ is BaseException.__init__ or name not in (
            "UnicodeDecodeError", "UnicodeEncodeError", "UnicodeTranslateError",
            "BaseExceptionGroup", "ExceptionGroup"):
        assert policy.retries(cls())
    flow_from_data(flow_data([name]))


@pytest.mark.parametrize("path", ["json.JSONDecodeError", "json:JSONDecodeError",
                                  "json.decoder.JSONDecodeError", "concurrent.futures."
                                  "TimeoutError", "chainweaver.errors:FlowFileError"])
def test_importable_paths_to_exception_classes_are_accepted(path: str) -> None:
    policy = RetryPolicy(retry_on=[path])
    assert policy.retry_on == (path,)
    assert dataclasses.replace(policy) == policy  # the stored entries resolve again
    [step] = flow_from_data(flow_data([path], index=0)).steps
    assert step.retry == policy


def test_classes_match_by_class_not_by_name(errors_module: str) -> None:
    import shop_errors

    policy = RetryPolicy(retry_on=[f"{errors_module}.CarrierDown"])
    assert policy.retries(shop_errors.CarrierDown())
    assert policy.retries(shop_errors.CarrierTimeout())  # a subclass
    assert not policy.retries(RuntimeError())
    # A class named like a built-in is not the built-in, either way round.
    assert not RetryPolicy(retry_on=["ConnectionError"]).retries(shop_errors.ConnectionError())
    assert not RetryPolicy(retry_on=[shop_errors.ConnectionError]).retries(ConnectionError())
    inner = RetryPolicy(retry_on=[f"{errors_module}.Nested.Inner"])
    assert inner.retries(shop_errors.Nested.Inner())


def test_a_class_passed_directly_is_kept_and_survives_replace() -> None:
    class Flaky(Exception):
        pass

    policy = RetryPolicy(retry_on=[Flaky, ConnectionError, "TimeoutError"])
    assert policy.retry_on == (Flaky, "ConnectionError", "TimeoutError")
    assert policy.retries(Flaky()) and policy.retries(ConnectionResetError())
    assert not policy.retries(ValueError())
    assert dataclasses.replace(policy, max_attempts=5).retry_on == policy.retry_on


def test_a_sub_flow_failure_matches_by_the_error_its_run_ended_with(
        errors_module: str) -> None:
    assert RetryPolicy(retry_on=["OSError"]).retries(SubFlowFailed("TimeoutError"))
    assert not RetryPolicy(retry_on=["ValueError"]).retries(SubFlowFailed("TimeoutError"))
    assert RetryPolicy(retry_on=[f"{errors_module}.CarrierDown"]).retries(
        SubFlowFailed("CarrierDown"))
    assert RetryPolicy(retry_on=["Exception"]).retries(SubFlowFailed("Whatever"))


# ------------------------------------------------------------------ what does not


@pytest.mark.parametrize(("entry", "problem"), [
    ("ConectionError", "'ConectionError' is not an exception class (did you mean "
     "'ConnectionError'? use a built-in exception name or an importable "
     "'package.module.ClassName')"),
    ("TimeOutError", "did you mean 'TimeoutError'?"),
    ("Excepton", "did you mean 'Exception'?"),
    ("print", "'print' is not an exception class"),  # a built-in, not an exception
    ("int", "'int' is not an exception class"),
    ("json.dumps", "'json.dumps' is not an exception class"),
    ("os.path", "'os.path' is not an exception class"),
    ("no_such_pkg.Error", "'no_such_pkg.Error' is not an exception class: cannot import it "
     "(ModuleNotFoundError"),
    ("json.NoSuchError", "cannot import it (AttributeError"),
    ("shop_errors.NOT_A_CLASS", "'shop_errors.NOT_A_CLASS' is not an exception class"),
    ("broken_errors.Error", "'broken_errors.Error': importing it failed: RuntimeError: "
     "no database"),
    ("not a class", "is not an exception class name or an importable"),
    ("json.", "is not an exception class name or an importable"),
    ("", "is not an exception class name or an importable"),
    (3, "must be an exception class or class name, got 3"),
    (10 ** 5000, "must be an exception class or class name, got a int"),
    (int, "'int' is not an exception class"),
], ids=lambda value: str(value)[:20] if not isinstance(value, int) else "number")
def test_unknown_names_are_definition_errors_naming_the_entry(
        errors_module: str, entry: object, problem: str) -> None:
    with pytest.raises(DefinitionError) as raised:
        RetryPolicy(retry_on=["TimeoutError", entry])  # type: ignore[list-item]
    assert str(raised.value).startswith("retry: retry_on[1]: ")
    assert problem in str(raised.value)


@pytest.mark.parametrize("entry", ["ConectionError", "json.dumps", "no_such_pkg.Error",
                                   "not a class"])
@pytest.mark.parametrize("index", [0, 2])
def test_a_flow_file_names_the_field_of_an_unknown_name(
        tmp_path: Path, errors_module: str, entry: str, index: int) -> None:
    path = tmp_path / "typo.flow.json"
    path.write_text(json.dumps(flow_data(["TimeoutError", entry], index=index)))
    with pytest.raises(FlowFileError) as raised:
        load_flows(path)
    assert raised.value.field == f"steps[{index}].retry.retry_on[1]"
    assert repr(entry) in raised.value.problem
    assert str(raised.value).startswith(f"{path}: steps[{index}].retry.retry_on[1]: ")


def test_the_issue_example_in_yaml(tmp_path: Path) -> None:
    path = tmp_path / "typo.flow.yaml"
    path.write_text("name: ping\ndescription: d\nsteps:\n  - find_order\n"
                    "  - tool: track_parcel\n    retry: {retry_on: [ConectionError]}\n")
    with pytest.raises(FlowFileError, match=re.escape(
            f"{path}: steps[1].retry.retry_on[0]: 'ConectionError' is not an exception "
            "class (did you mean 'ConnectionError'?")):
        load_flows(path)


identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,30}", fullmatch=True).filter(
    lambda name: not keyword.iskeyword(name))


@settings(max_examples=100, deadline=None)
@given(name=identifiers)
def test_any_bare_name_resolves_exactly_when_it_is_a_built_in_exception(name: str) -> None:
    target = getattr(builtins, name, None)
    if isinstance(target, type) and issubclass(target, BaseException):
        assert exception_class(name) is target
        return
    with pytest.raises(DefinitionError, match=re.escape(f"retry_on[0]: {name!r} is not "
                                                        "an exception class")):
        RetryPolicy(retry_on=[name])
    with pytest.raises(FlowFileError) as raised:
        flow_from_data(flow_data([name]))
    assert raised.value.field == "steps[1].retry.retry_on[0]"


@settings(max_examples=100, deadline=None)
@given(entry=st.text(max_size=40))
def test_any_text_is_accepted_or_refused_never_crashes(entry: str) -> None:
    try:
        policy = RetryPolicy(retry_on=[entry])
    except DefinitionError as error:
        assert str(error).startswith("retry: retry_on[0]: ")
    else:
        assert policy.retry_on  # it named a real exception class


# ------------------------------------------------------------------ the schema


@pytest.mark.parametrize(("entry", "valid"), [
    ("ConnectionError", True), ("json.JSONDecodeError", True),
    ("json:JSONDecodeError", True), ("pkg.mod:Outer.Inner", True),
    ("not a class", False), ("json.", False), ("a:b:c", False), ("", False),
    ("1Error", False),
])
def test_the_schema_pattern_is_the_reader_s_syntax(entry: str, valid: bool) -> None:
    assert CLASS_NAME_PATTERN == flow_file_schema()["$defs"]["RetryFormat"][
        "properties"]["retry_on"]["items"]["pattern"]
    validator = jsonschema.Draft202012Validator(flow_file_schema())
    data = flow_data([entry])
    assert validator.is_valid(data) is valid
    if not valid:
        with pytest.raises(FlowFileError, match=r"retry_on\[0\]"):
            flow_from_data(data)
