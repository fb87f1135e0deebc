"""Play input schemas: declared in Python or as JSON Schema, checked before a run exists.

    @play("enrich", input={"csv": str, "provider": Literal["alpha", "beta"], "limit": int | None})
    @play("enrich", input=EnrichInput)       # a TypedDict or a @dataclass class
    @play("enrich", input={"type": "object", "properties": {...}, "required": [...]})

Every spelling compiles to one JSON-Schema form (plain JSON: what `deepline check` shows),
and `violation` finds the first field that does not match it, named by its dotted path
(`company.domain`, `tags[2]`). A check never changes the input: defaults are not filled in.
Fields a schema does not mention are allowed.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Schema = dict[str, Any]

_PYTHON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
                                 dict: "object"}  # fmt: skip
_JSON_TYPES = frozenset({"string", "integer", "number", "boolean", "array", "object", "null"})
_ARTICLES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "null",
}
_PLURALS = {"string": "strings", "integer": "integers", "number": "numbers", "boolean": "booleans",
            "array": "lists", "object": "objects"}  # fmt: skip
# Keywords that only document a schema; `default` is shown, never applied.
_NOTES = frozenset({"title", "description", "default", "examples", "format", "deprecated", "readOnly", "writeOnly",
                    "$schema", "$id", "$comment"})  # fmt: skip
_CHECKS = frozenset({"type", "enum", "const", "properties", "required", "additionalProperties", "items", "anyOf",
                     "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
                     "pattern", "minItems", "maxItems"})  # fmt: skip


class SchemaDefinitionError(ValueError):
    """The schema itself is misspelled (a type an input cannot have, an unknown keyword)."""


@dataclass(frozen=True, slots=True)
class Violation:
    """The first place an input does not match its schema."""

    field: str  # dotted path; "" for the input as a whole
    problem: str  # "is required", "must be one of alpha, beta (got 'gamma')"

    def sentence(self, subject: str = "Input") -> str:
        if not self.field:
            return f"{subject} {self.problem}."
        return f"{subject} field {self.field!r} {self.problem}."


# --- compiling a declaration --------------------------------------------------------------


def compile_schema(spec: Any) -> Schema:
    """Any accepted spelling → its JSON-Schema form; a misspelling raises SchemaDefinitionError."""
    if is_json_schema(spec):
        _check_json_schema(spec, "")
        return dict(_plain(spec))
    if isinstance(spec, Mapping):
        return _object_of_fields(spec)
    if isinstance(spec, type) and (typing.is_typeddict(spec) or dataclasses.is_dataclass(spec)):
        return _from_class(spec)
    raise SchemaDefinitionError(
        f"an input schema is a dict of field types, a TypedDict or @dataclass class, or a JSON Schema "
        f"object, not {type(spec).__name__}"
    )


def is_json_schema(spec: Any) -> bool:
    """A JSON-Schema dict (`"type": "object"`, `"properties": {...}`) rather than a dict of
    field → Python type: in the latter `type` and `properties` would be types, not JSON."""
    return isinstance(spec, Mapping) and (
        isinstance(spec.get("type"), str | list) or isinstance(spec.get("properties"), Mapping)
    )


def _object_of_fields(fields: Mapping[Any, Any], path: str = "") -> Schema:
    properties: Schema = {}
    required = []
    for name, annotation in fields.items():
        if not isinstance(name, str) or not name:
            raise SchemaDefinitionError(f"field names are non-empty strings, not {name!r}")
        properties[name] = _from_type(annotation, _join(path, name))
        if not admits_null(properties[name]):
            required.append(name)
    return _object(properties, required)


def _object(properties: Schema, required: list[str]) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def _from_class(cls: type, path: str = "") -> Schema:
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:  # a name the annotations use is not defined (yet)
        raise SchemaDefinitionError(f"the annotations of {cls.__name__} cannot be read: {exc}") from None
    if typing.is_typeddict(cls):
        required_keys: frozenset[str] = getattr(cls, "__required_keys__", frozenset())
        declared = [(name, hint, name in required_keys) for name, hint in hints.items()]
    else:
        declared = [
            (f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            for f in dataclasses.fields(cls)
            if f.init
        ]
    properties: Schema = {}
    required = []
    for name, hint, needed in declared:
        # With `from __future__ import annotations`, Python 3.11 cannot see NotRequired
        # inside a string annotation: read the marker from the resolved hint.
        origin = typing.get_origin(hint)
        if origin is typing.NotRequired:
            hint, needed = typing.get_args(hint)[0], False
        elif origin is typing.Required:
            hint, needed = typing.get_args(hint)[0], True
        properties[name] = _from_type(hint, _join(path, name))
        if needed:
            required.append(name)
    return _object(properties, required)


def _from_type(annotation: Any, where: str) -> Schema:
    """One field's Python type → its schema."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is typing.Any or annotation is object:
        return {}
    if annotation is None or annotation is type(None):
        return {"type": "null"}
    if origin is typing.Annotated:
        return _from_type(args[0], where)
    if origin in (typing.Union, types.UnionType):
        return _union(args, where)
    if origin is typing.Literal:
        bad = [a for a in args if not isinstance(a, str | int | float | bool | type(None))]
        if bad:
            raise SchemaDefinitionError(f"field {where!r}: Literal values are strings, numbers or booleans")
        return {"enum": list(args)}
    if isinstance(annotation, type) and annotation in _PYTHON_TYPES:
        return {"type": _PYTHON_TYPES[annotation]}
    if origin is list and len(args) == 1:
        return {"type": "array", "items": _from_type(args[0], f"{where}[]")}
    if origin is dict and len(args) == 2:
        if args[0] is not str:
            raise SchemaDefinitionError(f"field {where!r}: JSON object keys are strings (dict[str, ...])")
        return {"type": "object", "additionalProperties": _from_type(args[1], f"{where}.*")}
    if isinstance(annotation, type) and (typing.is_typeddict(annotation) or dataclasses.is_dataclass(annotation)):
        return _from_class(annotation, where)
    if is_json_schema(annotation):
        _check_json_schema(annotation, where)
        return dict(_plain(annotation))
    if isinstance(annotation, Mapping):
        return _object_of_fields(annotation, where)
    raise SchemaDefinitionError(
        f"field {where!r}: {annotation!r} is not a type an input can have (use str, int, float, bool, list, dict, "
        "list[str], X | None, Literal[...], a TypedDict or a dataclass)"
    )


def _union(args: tuple[Any, ...], where: str) -> Schema:
    members = [a for a in args if a is not type(None)]
    inner = _from_type(members[0], where) if len(members) == 1 else {"anyOf": [_from_type(m, where) for m in members]}
    return nullable(inner) if len(members) < len(args) else inner


def nullable(schema: Schema) -> Schema:
    """`schema` that also admits null (`X | None`)."""
    if admits_null(schema):
        return schema
    if "enum" in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    kind = schema.get("type")
    if isinstance(kind, str) and "anyOf" not in schema:
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def admits_null(schema: Schema) -> bool:
    return violation(schema, None) is None


def _check_json_schema(node: Any, path: str) -> None:
    """A JSON Schema of the supported keywords, each of the right shape."""
    where = f"field {path!r}" if path else "the schema"
    if not isinstance(node, Mapping):
        raise SchemaDefinitionError(f"{where} must be a JSON Schema object, not {node!r}")
    for keyword in node:
        if keyword not in _CHECKS and keyword not in _NOTES:
            raise SchemaDefinitionError(f"{where} has an unknown keyword {keyword!r}")
    kinds = node.get("type", [])
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        if kind not in _JSON_TYPES:
            raise SchemaDefinitionError(f"{where}: type {kind!r} is not one of {', '.join(sorted(_JSON_TYPES))}")
    if "enum" in node and (not isinstance(node["enum"], list) or not node["enum"]):
        raise SchemaDefinitionError(f"{where}: enum must be a non-empty list")
    for keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if keyword in node and (isinstance(node[keyword], bool) or not isinstance(node[keyword], int | float)):
            raise SchemaDefinitionError(f"{where}: {keyword} must be a number")
    for keyword in ("minLength", "maxLength", "minItems", "maxItems"):
        if keyword in node and (isinstance(node[keyword], bool) or not isinstance(node[keyword], int)):
            raise SchemaDefinitionError(f"{where}: {keyword} must be a whole number")
    if "pattern" in node:
        try:
            re.compile(node["pattern"])
        except (re.error, TypeError) as exc:
            message = f"{where}: pattern {node['pattern']!r} is not a regular expression: {exc}"
            raise SchemaDefinitionError(message) from None
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaDefinitionError(f"{where}: required must be a list of field names")
    properties = node.get("properties", {})
    if not isinstance(properties, Mapping):
        raise SchemaDefinitionError(f"{where}: properties must map field names to schemas")
    for name, sub in properties.items():
        _check_json_schema(sub, _join(path, name))
    if "items" in node:
        _check_json_schema(node["items"], f"{path}[]")
    extra = node.get("additionalProperties", True)
    if not isinstance(extra, bool):
        _check_json_schema(extra, _join(path, "*"))
    if "anyOf" in node:
        if not isinstance(node["anyOf"], list) or not node["anyOf"]:
            raise SchemaDefinitionError(f"{where}: anyOf must be a non-empty list of schemas")
        for sub in node["anyOf"]:
            _check_json_schema(sub, path)


def _plain(value: Any) -> Any:
    """A copy made only of dicts and lists (a Mapping or tuple a user passed becomes JSON)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# --- checking an input ----------------------------------------------------------------------


def violation(schema: Schema, value: Any, path: str = "") -> Violation | None:
    """The first place `value` does not match `schema` (fields in declared order), or None."""
    if "anyOf" in schema:
        found = _any_of(schema, value, path)
        if found is not None:
            return found
    for check in (_enum, _type, _bounds, _length, _items, _fields):
        found = check(schema, value, path)
        if found is not None:
            return found
    return None


def _any_of(schema: Schema, value: Any, path: str) -> Violation | None:
    branches = schema["anyOf"]
    results = [violation(branch, value, path) for branch in branches]
    if any(r is None for r in results):
        return None
    # One branch of the value's own kind (an object for `Company | None`): its finding is the useful one.
    own = [r for branch, r in zip(branches, results, strict=True) if _kind(value) in _types_of(branch)]
    if len(own) == 1:
        return own[0]
    return Violation(path, f"must be {expected(schema)} (got {shown(value)})")


def _enum(schema: Schema, value: Any, path: str) -> Violation | None:
    allowed = schema["enum"] if "enum" in schema else [schema["const"]] if "const" in schema else None
    if allowed is None or any(_same(value, a) for a in allowed):
        return None
    return Violation(path, f"must be {_choices(allowed)} (got {shown(value)})")


def _type(schema: Schema, value: Any, path: str) -> Violation | None:
    kinds = _declared_types(schema)
    if kinds is None or _kind(value) in kinds or (_kind(value) == "integer" and "number" in kinds):
        return None
    return Violation(path, f"must be {_any_type(kinds)} (got {shown(value)})")


def _bounds(schema: Schema, value: Any, path: str) -> Violation | None:
    if _kind(value) not in ("integer", "number"):
        return None
    limits = [
        ("minimum", value < schema.get("minimum", value), "at least"),
        ("maximum", value > schema.get("maximum", value), "at most"),
        ("exclusiveMinimum", "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"], "more than"),
        ("exclusiveMaximum", "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"], "less than"),
    ]
    for keyword, broken, words in limits:
        if broken:
            return Violation(path, f"must be {words} {schema[keyword]:g} (got {shown(value)})")
    return None


def _length(schema: Schema, value: Any, path: str) -> Violation | None:
    if isinstance(value, str):
        size, unit = len(value), "character"
        low, high = schema.get("minLength"), schema.get("maxLength")
    elif isinstance(value, list):
        size, unit = len(value), "item"
        low, high = schema.get("minItems"), schema.get("maxItems")
    else:
        return None
    if low is not None and size < low:
        return Violation(path, f"must have at least {_count(low, unit)} (got {size})")
    if high is not None and size > high:
        return Violation(path, f"must have at most {_count(high, unit)} (got {size})")
    if isinstance(value, str) and "pattern" in schema and re.search(schema["pattern"], value) is None:
        return Violation(path, f"must match the pattern {schema['pattern']!r} (got {shown(value)})")
    return None


def _items(schema: Schema, value: Any, path: str) -> Violation | None:
    if "items" not in schema or not isinstance(value, list):
        return None
    for index, item in enumerate(value):
        found = violation(schema["items"], item, f"{path}[{index}]")
        if found is not None:
            return found
    return None


def _fields(schema: Schema, value: Any, path: str) -> Violation | None:
    if not isinstance(value, dict):
        return None
    properties: Schema = schema.get("properties", {})
    required = schema.get("required", [])
    for name in [*properties, *(r for r in required if r not in properties)]:
        if name not in value:
            if name in required:
                return Violation(_join(path, name), "is required")
            continue
        if name in properties:
            found = violation(properties[name], value[name], _join(path, name))
            if found is not None:
                return found
    extra = schema.get("additionalProperties", True)
    for name in value:
        if name in properties or extra is True:
            continue
        if extra is False:
            allowed = ", ".join(properties) or "none"
            return Violation(_join(path, name), f"is not a known field (known: {allowed})")
        found = violation(extra, value[name], _join(path, name))
        if found is not None:
            return found
    return None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _declared_types(schema: Schema) -> list[str] | None:
    kinds = schema.get("type")
    if kinds is None:
        return None
    return [kinds] if isinstance(kinds, str) else list(kinds)


def _types_of(schema: Schema) -> set[str]:
    """The kinds of value a schema can take (every kind when it does not say)."""
    if "anyOf" in schema:
        return set().union(*(_types_of(b) for b in schema["anyOf"]))
    if "enum" in schema:
        return {_kind(v) for v in schema["enum"]}
    kinds = _declared_types(schema)
    if kinds is None:
        return set(_JSON_TYPES)
    return set(kinds) | ({"integer"} if "number" in kinds else set())


def _same(value: Any, allowed: Any) -> bool:
    """JSON equality: `true` is not `1`, `1` is `1.0`."""
    return bool(value == allowed) and isinstance(value, bool) == isinstance(allowed, bool)


# --- words ------------------------------------------------------------------------------------


def shown(value: Any) -> str:
    """A value as an error message quotes it: short, JSON's words for true/false/null."""
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _choice(value: Any) -> str:
    return value if isinstance(value, str) else shown(value)


def _choices(allowed: list[Any]) -> str:
    names = [_choice(a) for a in allowed if a is not None]
    text = names[0] if len(names) == 1 else f"one of {', '.join(names)}"
    return f"{text} or null" if None in allowed else text


def _any_type(kinds: list[str]) -> str:
    words = [_ARTICLES.get(k, k) for k in kinds if k != "null"]
    if "null" in kinds:
        words.append("null")
    return " or ".join(words)


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}" + ("" if n == 1 else "s")


def expected(schema: Schema) -> str:
    """What a schema asks for, in words: `one of alpha, beta`, `a list of strings`, `an integer or null`."""
    if "anyOf" in schema:
        return " or ".join(expected(branch) for branch in schema["anyOf"])
    if "enum" in schema or "const" in schema:
        return _choices(schema["enum"] if "enum" in schema else [schema["const"]])
    kinds = _declared_types(schema)
    if kinds is None:
        return "anything"
    if "array" in kinds and "items" in schema:
        items = schema["items"]
        plural = _PLURALS.get(str(items.get("type"))) if set(items) <= {"type"} else None
        listed = f"a list of {plural}" if plural else f"a list (each {expected(items)})"
        return " or ".join(listed if k == "array" else _ARTICLES.get(k, k) for k in kinds)
    return _any_type(kinds)


def limits(schema: Schema) -> list[str]:
    """A schema's bounds in words: `at least 1`, `at most 100 characters`, `matching '^a'`."""
    words = {"minimum": "at least", "maximum": "at most", "exclusiveMinimum": "more than",
             "exclusiveMaximum": "less than"}  # fmt: skip
    found = [f"{w} {schema[k]:g}" for k, w in words.items() if k in schema]
    for keyword, unit in (("minLength", "character"), ("minItems", "item")):
        if keyword in schema:
            found.append(f"at least {_count(schema[keyword], unit)}")
    for keyword, unit in (("maxLength", "character"), ("maxItems", "item")):
        if keyword in schema:
            found.append(f"at most {_count(schema[keyword], unit)}")
    if "pattern" in schema:
        found.append(f"matching {schema['pattern']!r}")
    return found


@dataclass(frozen=True, slots=True)
class FieldDoc:
    path: str
    expected: str
    required: bool


def fields(schema: Schema, path: str = "") -> list[FieldDoc]:
    """The fields of an object schema, nested objects flattened to dotted paths."""
    found = []
    required = schema.get("required", [])
    for name, sub in (schema.get("properties") or {}).items():
        where = _join(path, name)
        if sub.get("type") == "object" and sub.get("properties"):
            found.append(FieldDoc(where, "an object", name in required))
            found.extend(fields(sub, where))
            continue
        words = ", ".join([expected(sub), *limits(sub)])
        found.append(FieldDoc(where, words, name in required))
    return found
