"""Versions compare as versions (semver and PEP 440), seen through the registry."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chainweaver import DuplicateFlowError, Flow, FlowRegistry, FlowStep, InvalidVersionError
from chainweaver.versions import is_valid_version, version_key


def ordered(*versions: str) -> list[str]:
    """Register flows in a shuffled order and return the registry's version order."""
    registry = FlowRegistry()
    shuffled = list(versions)
    random.Random(7).shuffle(shuffled)
    for version in shuffled:
        registry.register_flow(Flow("f", "", [FlowStep("t")], version=version))
    return registry.versions("f")


def test_numeric_components_compare_as_numbers() -> None:
    assert ordered("1.10.0", "1.9.0", "1.2.0", "10.0.0", "2.0.0") == [
        "1.2.0", "1.9.0", "1.10.0", "2.0.0", "10.0.0"
    ]


def test_semver_precedence_from_the_spec() -> None:
    # semver.org section 11 example, in order.
    expected = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta",
                "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0"]
    assert ordered(*expected) == expected


def test_pep440_ordering() -> None:
    expected = ["1!0.5", "1!1.0.dev1", "1!1.0a1.dev2", "1!1.0a1", "1!1.0b2", "1!1.0rc1",
                "1!1.0", "1!1.0.post1.dev1", "1!1.0.post1", "1!1.0.post2", "1!1.1"]
    assert ordered(*expected) == expected
    assert version_key("1!0.1") > version_key("99.0")  # epochs dominate


def test_mixed_schemes_share_one_order() -> None:
    assert ordered("1.0.0-rc.2", "1.0rc1", "1.0.0", "1.0.1", "1.1") == [
        "1.0rc1", "1.0.0-rc.2", "1.0.0", "1.0.1", "1.1"
    ]


@pytest.mark.parametrize(
    ("a", "b"),
    [("1.0", "1.0.0"), ("1", "1.0.0"), ("v1.0.0", "1.0.0"), ("1.0a1", "1.0.0-alpha.1"),
     ("1.0rc1", "1.0.0-rc.1"), ("1.0c1", "1.0rc1"), ("1.0-preview1", "1.0rc1"),
     ("1.0.post1", "1.0-1"), ("1.0.post1", "1.0rev1"), ("1.0.0", " 1.0.0 "),
     ("1.0+Local", "1.0+local"), ("01.0", "1.0.0")],
)
def test_equal_spellings_are_duplicates(a: str, b: str) -> None:
    assert version_key(a) == version_key(b)
    registry = FlowRegistry()
    registry.register_flow(Flow("f", "", [FlowStep("t")], version=a))
    with pytest.raises(DuplicateFlowError):
        registry.register_flow(Flow("f", "", [FlowStep("t")], version=b))
    assert registry.get_flow("f", b).version == a


def test_local_version_sorts_after_the_public_one() -> None:
    assert version_key("1.0+ubuntu1") > version_key("1.0")


@pytest.mark.parametrize("bad", ["", "latest", "1.0.0-", "x1.0", None, 1.0])
def test_invalid_versions(bad) -> None:
    with pytest.raises(InvalidVersionError):
        version_key(bad)
    assert is_valid_version(bad) is False
    assert is_valid_version("1.2.3") is True


@pytest.mark.parametrize("spelling", ["1.{}.0", "1.0rc{}", "{}!1.0", "1.0.post{}",
                                      "1.0.dev{}", "1.0.0-{}", "{}"])
def test_a_number_past_pythons_digit_limit_is_an_invalid_version(spelling: str) -> None:
    # int() refuses more than 4300 digits (ValueError): the length is checked first.
    version = spelling.format("9" * 5000)
    with pytest.raises(InvalidVersionError, match=r"is \d+ characters long; at most 256 are "
                       "allowed") as caught:
        version_key(version)
    assert len(str(caught.value)) < 200  # the value is shortened, not echoed whole
    assert is_valid_version(version) is False
    with pytest.raises(InvalidVersionError):
        Flow("f", "", [FlowStep("t")], version=version)
    registry = FlowRegistry()
    registry.register_flow(Flow("f", "", [FlowStep("t")]))
    with pytest.raises(InvalidVersionError):
        registry.get_flow("f", version)  # a version asked for is checked the same way


def test_a_version_holds_up_to_256_characters() -> None:
    longest = "1.0.0+" + "a" * 250
    assert len(longest) == 256 and is_valid_version(longest)
    assert not is_valid_version(longest + "a")
    assert not is_valid_version(f" {longest}")  # counted as written
    assert version_key("1." + "9" * 250) > version_key("1." + "9" * 249)


def dotted(parts) -> str:
    return ".".join(str(part) for part in parts)


naturals = st.integers(min_value=0, max_value=10_000)
triples = st.tuples(naturals, naturals, naturals)


@given(triples, triples)
def test_semver_triples_compare_like_integer_tuples(a, b) -> None:
    ka, kb = version_key(dotted(a)), version_key(dotted(b))
    assert (ka < kb) == (a < b)
    assert (ka == kb) == (a == b)


@given(st.lists(naturals, min_size=1, max_size=5), st.lists(naturals, min_size=1, max_size=5))
def test_pep440_releases_compare_like_zero_padded_tuples(a, b) -> None:
    width = max(len(a), len(b))
    pa, pb = tuple(a) + (0,) * (width - len(a)), tuple(b) + (0,) * (width - len(b))
    ka = version_key(dotted(a))
    kb = version_key(dotted(b))
    assert (ka < kb) == (pa < pb)
    assert (ka == kb) == (pa == pb)


@given(triples, st.sampled_from(["alpha", "beta", "rc"]), st.integers(0, 50))
def test_a_pre_release_sorts_before_its_release(release, label, number) -> None:
    base = dotted(release)
    assert version_key(f"{base}-{label}.{number}") < version_key(base)
    pep440 = {"alpha": "a", "beta": "b", "rc": "rc"}[label]
    assert version_key(f"{base}{pep440}{number}") < version_key(base)


@given(st.lists(triples, min_size=1, max_size=8, unique=True))
def test_registry_latest_is_the_highest_triple(releases) -> None:
    registry = FlowRegistry()
    for release in releases:
        registry.register_flow(Flow("f", "", [FlowStep("t")], version=dotted(release)))
    assert registry.get_flow("f").version == dotted(max(releases))
    assert registry.versions("f") == [dotted(r) for r in sorted(releases)]
