"""Play input schemas (deepline_cli/runtime/schema.py): the three spellings, the messages,
and property-style checks over random schemas and inputs (seeded, so a failure repeats)."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, Optional, TypedDict

import pytest

from deepline_cli.runtime.run.schema import SchemaDefinitionError, compile_schema, fields, violation


def message(schema: Any, value: Any) -> str | None:
    found = violation(compile_schema(schema), value)
    return None if found is None else found.sentence()


# --- the Python spelling: a dict of field → type --------------------------------------------

FIELDS = {"provider": Literal["alpha", "beta"], "limit": int, "ratio": float, "dry": bool, "tags": list[str] | None}
GOOD = {"provider": "alpha", "limit": 3, "ratio": 0.5, "dry": False}


def test_a_good_input_passes_and_extra_fields_are_allowed() -> None:
    assert message(FIELDS, GOOD) is None
    assert message(FIELDS, {**GOOD, "tags": ["a"], "unknown": {"x": 1}}) is None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"provider": "gamma"}, "Input field 'provider' must be one of alpha, beta (got 'gamma')."),
        ({"limit": None}, "Input field 'limit' must be an integer (got null)."),
        ({"limit": "ten"}, "Input field 'limit' must be an integer (got 'ten')."),
        ({"limit": True}, "Input field 'limit' must be an integer (got true)."),  # a bool is not a number
        ({"limit": 2.5}, "Input field 'limit' must be an integer (got 2.5)."),
        ({"ratio": "x"}, "Input field 'ratio' must be a number (got 'x')."),
        ({"dry": 1}, "Input field 'dry' must be true or false (got 1)."),
        ({"tags": "a,b"}, "Input field 'tags' must be a list or null (got 'a,b')."),
        ({"tags": ["a", 3]}, "Input field 'tags[1]' must be a string (got 3)."),
    ],
)
def test_a_wrong_field_is_named_with_what_was_expected(change: dict[str, Any], expected: str) -> None:
    assert message(FIELDS, {**GOOD, **change}) == expected


def test_a_field_whose_type_does_not_admit_none_is_required() -> None:
    del_limit = {k: v for k, v in GOOD.items() if k != "limit"}
    assert message(FIELDS, del_limit) == "Input field 'limit' is required."
    assert message(FIELDS, {**GOOD, "tags": None}) is None  # X | None: optional and nullable
    assert message({"n": Optional[int]}, {}) is None  # noqa: UP045 (the old spelling works too)


def test_an_int_is_a_number_but_not_the_other_way_round() -> None:
    assert message({"x": float}, {"x": 3}) is None
    assert message({"x": int}, {"x": 3.0}) == "Input field 'x' must be an integer (got 3.0)."


def test_a_whole_input_that_is_not_an_object() -> None:
    assert message(FIELDS, [1, 2]) == "Input must be an object (got a list)."


def test_nested_fields_are_named_by_dotted_path() -> None:
    schema = {"company": {"domain": str, "size": int | None}, "people": list[dict[str, str]]}
    assert message(schema, {"company": {}, "people": []}) == "Input field 'company.domain' is required."
    assert message(schema, {"company": {"domain": 1}, "people": []}) == (
        "Input field 'company.domain' must be a string (got 1)."
    )
    assert message(schema, {"company": {"domain": "a.com"}, "people": [{"n": "x"}, {"n": 2}]}) == (
        "Input field 'people[1].n' must be a string (got 2)."
    )


def test_union_and_any() -> None:
    assert message({"id": int | str}, {"id": "a"}) is None
    assert message({"id": int | str}, {"id": 1.5}) == "Input field 'id' must be an integer or a string (got 1.5)."
    assert message({"x": Any}, {}) is None  # Any admits None: not required


# --- TypedDict and dataclass -------------------------------------------------------------------


class Company(TypedDict):
    domain: str
    size: NotRequired[int]


class Lead(TypedDict, total=False):
    company: Company
    note: str


class Strict(TypedDict):
    company: Company
    note: str | None


@dataclass
class Options:
    provider: Literal["alpha", "beta"]
    limit: int = 10
    tags: list[str] = field(default_factory=list)


def test_typeddict_honours_total_and_not_required() -> None:
    assert message(Lead, {}) is None
    assert message(Lead, {"company": {"domain": "a.com"}}) is None  # size is NotRequired
    assert message(Lead, {"company": {}}) == "Input field 'company.domain' is required."
    assert message(Strict, {"note": None}) == "Input field 'company' is required."
    assert message(Strict, {"company": {"domain": "a.com"}}) == "Input field 'note' is required."
    assert message(Strict, {"company": {"domain": "a.com"}, "note": None}) is None


def test_a_dataclass_makes_fields_with_defaults_optional_and_never_fills_them() -> None:
    value = {"provider": "beta"}
    assert message(Options, value) is None
    assert value == {"provider": "beta"}  # only checked: no default was filled in
    assert message(Options, {}) == "Input field 'provider' is required."
    assert message(Options, {"provider": "beta", "tags": [1]}) == "Input field 'tags[0]' must be a string (got 1)."


# --- the JSON-Schema spelling -------------------------------------------------------------------

JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "limit": {"type": "integer", "minimum": 1, "maximum": 100},
        "provider": {"enum": ["alpha", "beta"]},
        "company": {
            "type": "object",
            "properties": {"domain": {"type": "string", "minLength": 3, "pattern": r"\."}},
            "required": ["domain"],
        },
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    },
    "required": ["limit"],
}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"limit": 5}, None),
        ({}, "Input field 'limit' is required."),
        ({"limit": 0}, "Input field 'limit' must be at least 1 (got 0)."),
        ({"limit": 101}, "Input field 'limit' must be at most 100 (got 101)."),
        ({"limit": 5, "provider": "gamma"}, "Input field 'provider' must be one of alpha, beta (got 'gamma')."),
        ({"limit": 5, "company": {}}, "Input field 'company.domain' is required."),
        ({"limit": 5, "company": {"domain": "ab"}},
         "Input field 'company.domain' must have at least 3 characters (got 2)."),
        ({"limit": 5, "company": {"domain": "abc"}},
         "Input field 'company.domain' must match the pattern '\\\\.' (got 'abc')."),
        ({"limit": 5, "tags": ["a", "b", "c"]}, "Input field 'tags' must have at most 2 items (got 3)."),
        ({"limit": 5, "ratio": 1}, "Input field 'ratio' must be less than 1 (got 1)."),
        ({"limit": 5, "ratio": 0}, "Input field 'ratio' must be more than 0 (got 0)."),
    ],
)  # fmt: skip
def test_json_schema_keywords(value: dict[str, Any], expected: str | None) -> None:
    assert message(JSON_SCHEMA, value) == expected


def test_additional_properties_false_is_honoured_when_asked() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}
    assert message(schema, {"a": "x", "b": 1}) == "Input field 'b' is not a known field (known: a)."


def test_check_describes_fields_with_dotted_paths() -> None:
    docs = {f.path: (f.expected, f.required) for f in fields(compile_schema(JSON_SCHEMA))}
    assert docs["limit"] == ("an integer, at least 1, at most 100", True)
    assert docs["company.domain"] == ("a string, at least 3 characters, matching '\\\\.'", True)
    assert docs["tags"] == ("a list of strings, at most 2 items", False)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"x": set}, "field 'x'"),
        ({"a": {"b": tuple}}, "field 'a.b'"),
        ({"x": dict[int, str]}, "JSON object keys are strings"),
        ({"type": "object", "requried": ["a"]}, "unknown keyword 'requried'"),
        ({"type": "object", "properties": {"a": {"type": "strng"}}}, "type 'strng'"),
        ({"type": "object", "properties": {"a": {"minimum": "1"}}}, "minimum must be a number"),
        ({"type": "object", "required": "a"}, "required must be a list"),
        (42, "not int"),
    ],
)
def test_a_misspelled_schema_is_refused_with_where(spec: Any, words: str) -> None:
    with pytest.raises(SchemaDefinitionError) as info:
        compile_schema(spec)
    assert words in str(info.value)


# --- properties over random schemas and inputs ------------------------------------------------

# (Python type, JSON Schema, a value it takes, values it refuses)
KINDS: list[tuple[Any, dict[str, Any], Any, list[Any]]] = [
    (str, {"type": "string"}, "text", [1, 2.5, True, [], {}]),
    (int, {"type": "integer"}, 7, ["7", 2.5, True, [], {}]),
    (float, {"type": "number"}, 1.5, ["1.5", False, [], {}]),
    (bool, {"type": "boolean"}, True, [1, "true", [], {}]),
    (list, {"type": "array"}, [1, "a"], ["a", 1, {}]),
    (dict, {"type": "object"}, {"k": 1}, ["a", 1, []]),
    (list[str], {"type": "array", "items": {"type": "string"}}, ["a", "b"], [[1], ["a", None], "a"]),
    (Literal["a", "b"], {"enum": ["a", "b"]}, "b", ["c", 1, None]),
]


def _random_declaration(rng: random.Random) -> list[tuple[str, int, bool]]:
    """(field name, index into KINDS, optional) for 1-6 fields."""
    names = rng.sample(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta"], rng.randint(1, 6))
    return [(name, rng.randrange(len(KINDS)), rng.random() < 0.4) for name in names]


def _spellings(declaration: list[tuple[str, int, bool]]) -> list[Any]:
    """The same declaration as a dict of types, a TypedDict and a JSON Schema."""
    as_types = {n: (KINDS[k][0] | None if opt else KINDS[k][0]) for n, k, opt in declaration}
    required = [n for n, _, opt in declaration if not opt]
    typed_fields = {n: (NotRequired[KINDS[k][0] | None] if opt else KINDS[k][0]) for n, k, opt in declaration}
    typed = TypedDict("Random", typed_fields)  # type: ignore[misc]
    as_json = {
        "type": "object",
        "properties": {n: (dict(KINDS[k][1]) if not opt else _json_nullable(KINDS[k][1])) for n, k, opt in declaration},
        "required": required,
    }
    return [as_types, typed, as_json]


def _json_nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if "enum" in schema:
        return {"enum": [*schema["enum"], None]}
    return {**schema, "type": [schema["type"], "null"]}


def _good_value(rng: random.Random, declaration: list[tuple[str, int, bool]]) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for name, kind, optional in declaration:
        roll = rng.random()
        if optional and roll < 0.3:
            continue  # omitted
        value[name] = None if optional and roll < 0.5 else copy.deepcopy(KINDS[kind][2])
    if rng.random() < 0.5:
        value["not_declared"] = rng.choice([1, "x", None, [1], {"a": 2}])  # extra fields are allowed
    return value


@pytest.mark.parametrize("seed", range(6))
def test_property_every_spelling_accepts_conforming_inputs_and_changes_nothing(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(60):
        declaration = _random_declaration(rng)
        value = _good_value(rng, declaration)
        before = copy.deepcopy(value)
        for spelling in _spellings(declaration):
            assert violation(compile_schema(spelling), value) is None, (declaration, value)
        assert value == before


@pytest.mark.parametrize("seed", range(6))
def test_property_one_broken_field_is_the_one_named_by_every_spelling(seed: int) -> None:
    rng = random.Random(1000 + seed)
    for _ in range(60):
        declaration = _random_declaration(rng)
        value = _good_value(rng, declaration)
        name, kind, optional = rng.choice(declaration)
        if not optional and rng.random() < 0.3:
            value.pop(name, None)
        else:
            value[name] = rng.choice(KINDS[kind][3])
            if optional and value[name] is None:
                continue  # None is fine for an optional field
        messages = set()
        for spelling in _spellings(declaration):
            found = violation(compile_schema(spelling), value)
            assert found is not None, (declaration, value)
            assert found.field.split("[")[0] == name, (declaration, value, found)
            sentence = found.sentence()
            assert sentence.endswith(".") and "\n" not in sentence and f"field '{found.field}' " in sentence
            messages.add(sentence)
        assert len(messages) == 1, messages  # the three spellings say the same thing


@pytest.mark.parametrize("seed", range(4))
def test_property_compiled_schemas_are_plain_json_and_compile_to_themselves(seed: int) -> None:
    from deepline_cli import _json

    rng = random.Random(2000 + seed)
    for _ in range(40):
        for spelling in _spellings(_random_declaration(rng)):
            compiled = compile_schema(spelling)
            assert _json.loads(_json.dumps(compiled)) == compiled  # what `deepline check --json` prints
            assert compile_schema(compiled) == compiled  # a compiled schema is a JSON Schema of its own
