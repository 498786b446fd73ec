"""The grammar engine's JSON Schema support against Python's jsonschema.

Each case is a schema and a document; the C++ matcher (tests/tools/grammar_check) must
accept exactly the documents jsonschema says are valid. Documents are written in the one
layout the engine generates (properties in schema order, at most one space after ',' and
':'), and objects with `properties` state `additionalProperties`, since the engine's
default is false (OpenAI strict mode) where JSON Schema's is true.
"""

import datetime
import json
import subprocess

import jsonschema
import pytest

from conftest import tool_path

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}

# (schema, [documents]); every document's expected verdict comes from jsonschema.
CORPUS = [
    # not of types and of values; allOf and keywords beside anyOf merged into one schema.
    ({"not": {"type": "string"}}, ['1', '"x"', 'null', '{}', '{"k": [1]}', '[1, "a"]']),
    ({"type": "string", "not": {"enum": ["ab", "a"]}}, ['"ab"', '"a"', '"abc"', '""', '"b"', '"a\\"']),
    ({"type": "integer", "minimum": 0, "maximum": 9, "not": {"enum": [0, 4]}}, ['0', '4', '5', '9', '10', '-1']),
    ({"type": "number", "not": {"const": 1}}, ['1', '1.5', '0.999', '-1']),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                 "additionalProperties": True},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     ['{"a": 1, "b": "x"}', '{"a": 1}', '{"b": "x"}', '{"a": 1, "b": "x", "c": 2}', '{"a": "1", "b": "x"}']),
    ({"type": "integer", "anyOf": [{"minimum": 10}, {"maximum": -10}]}, ['12', '-10', '0', '12.5', '-9']),
    # unevaluated*: beside an applicator they see what it evaluates; inside a member, not.
    ({"allOf": [{"properties": {"a": {"type": "integer"}}}], "properties": {"b": {"type": "integer"}},
      "unevaluatedProperties": False}, ['{"b": 2, "a": 1}', '{"b": 2}', '{"b": 2, "a": 1, "c": 3}', '{"a": "x"}']),
    ({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}, "unevaluatedProperties": False}]},
     ['{"b": 1}', '{"a": 1, "b": 1}', '{}', '{"c": 1}']),
    ({"prefixItems": [{"type": "integer"}], "unevaluatedItems": False}, ['[1]', '[]', '[1, 2]', '["a"]']),
    ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": {"type": "boolean"},
      "minItems": 1, "maxItems": 3}, ['[1]', '[1, "a"]', '[1, "a", true]', '[]', '["a"]', '[1, "a", true, false]',
                                       '[1, 2]']),
    (PERSON, ['{"name": "Ada", "age": 36}', '{"name":"Ada","age":36,"email":"ada@example.com"}',
              '{"name": "", "age": 36}', '{"name": "Ada", "age": -1}', '{"name": "Ada", "age": 151}',
              '{"name": "Ada"}', '{"name": "Ada", "age": 36, "x": 1}', '{"name": "Ada", "age": 3.5}',
              '{"name": "Ada", "age": 36, "email": "nobody"}', '{"name": "' + "a" * 21 + '", "age": 1}']),
    ({"type": "string"}, ['"plain"', '"esc \\" \\\\ \\n \\u00e9"', '"é€😀"', '"raw\ttab"', '1', 'null', '"unterminated']),
    ({"type": "integer"}, ['0', '-7', '123456789', '01', '1.5', '-', '"1"']),
    ({"type": "number"}, ['0', '-0.5', '3.25e-2', '1E+3', '.5', '1.', '"x"', 'true', '-0']),
    ({"type": "boolean"}, ['true', 'false', 'True', '0', 'null']),
    ({"type": "null"}, ['null', 'nul', '0', '""']),
    ({"type": ["string", "integer", "null"]}, ['"a"', '5', 'null', '5.5', '[]', 'false']),
    ({"enum": ["red", "green", 3, None, True]}, ['"red"', '"green"', '3', 'null', 'true', '"blue"', 'false', '4']),
    ({"const": "fixed"}, ['"fixed"', '"fixed "', '"Fixed"']),
    ({"type": "array", "items": {"type": "integer"}}, ['[]', '[1, 2, 3]', '[1,2]', '[1, "2"]', '[1,]', '{}']),
    ({"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 3},
     ['["a", "b"]', '["a", "b", "c"]', '["a"]', '["a", "b", "c", "d"]', '[]']),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "additionalProperties": False},
     ['{}', '{"a": 1}', '{"b": 2}', '{"a": 1, "b": 2}', '{"a": "1"}', '{"c": 1}', '{"a": 1,}']),
    ({"type": "object", "additionalProperties": {"type": "boolean"}},
     ['{}', '{"x": true, "y": false}', '{"x": 1}', '{"x": true, }']),
    ({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
      "additionalProperties": True},
     ['{"id": 1}', '{"id": 1, "extra": [1, {"k": null}]}', '{"extra": 1}']),
    ({"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
     ['"ABC-12"', '"ABC-1234"', '"AB-12"', '"ABC-12345"', '"abc-12"']),
    ({"type": "string", "pattern": "[0-9]"}, ['"x1y"', '"9"', '"none"', '""']),
    ({"type": "string", "minLength": 2, "maxLength": 4}, ['"ab"', '"abcd"', '"a"', '"abcde"', '"éé"', '"😀😀😀😀"']),
    ({"type": "string", "format": "date"}, ['"2024-02-29"', '"2024-12-31"', '"2024-13-01"', '"2024-1-01"', '"20240101"']),
    ({"type": "string", "format": "uuid"},
     ['"123e4567-e89b-12d3-a456-426614174000"', '"123e4567e89b12d3a456426614174000"', '"123e4567-e89b-12d3-a456-42661417400"']),
    ({"type": "string", "format": "ipv4"}, ['"192.168.0.1"', '"255.255.255.255"', '"256.1.1.1"', '"1.2.3"']),
    ({"type": "string", "format": "date-time"},
     ['"2024-05-06T07:08:09Z"', '"2024-05-06T07:08:09.123+02:00"', '"2024-05-06 07:08:09Z"', '"2024-05-06T25:08:09Z"']),
    ({"type": "integer", "minimum": 10, "maximum": 99}, ['10', '99', '55', '9', '100', '-10']),
    ({"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 3}, ['-2', '0', '2', '-3', '3']),
    ({"type": "number", "minimum": 0, "maximum": 10}, ['0', '9.999', '10', '10.0', '10.5', '-0.1']),
    ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 5}]},
     ['"ab"', '7', '"abc"', '3', 'null']),
    ({"oneOf": [{"type": "boolean"}, {"type": "null"}]}, ['true', 'null', '0']),
    ({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                          "required": ["x", "y"], "additionalProperties": False}},
      "type": "array", "items": {"$ref": "#/$defs/point"}},
     ['[]', '[{"x": 1, "y": 2}]', '[{"x": 1}]', '[{"x": 1, "y": 2, "z": 3}]']),
    ({"type": "object", "properties": {"value": {"type": "integer"},
                                       "children": {"type": "array", "items": {"$ref": "#"}}},
      "required": ["value"], "additionalProperties": False},
     ['{"value": 1}', '{"value": 1, "children": [{"value": 2, "children": []}]}', '{"value": 1, "children": [{}]}']),
    ({"type": "object", "properties": {
        "user": {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
                 "required": ["name"], "additionalProperties": False},
        "active": {"type": "boolean"}},
      "required": ["user", "active"], "additionalProperties": False},
     ['{"user": {"name": "x"}, "active": true}', '{"user": {"name": "x", "tags": ["a", "b"]}, "active": false}',
      '{"user": {"name": "x", "tags": ["c"]}, "active": true}', '{"user": {}, "active": true}', '{"active": true}']),
    ({}, ['1', '"s"', '{"a": [1, 2, {"b": null}]}', '[true, false]', 'nope', '{"a" 1}']),
]


def expected(schema, doc):
    try:
        instance = json.loads(doc)
    except json.JSONDecodeError:
        return False
    checker = jsonschema.FormatChecker()

    @checker.checks("date-time")
    def _date_time(value):  # jsonschema's own needs an optional package
        if not isinstance(value, str) or "T" not in value:
            return False
        try:
            datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return False
        return True

    return jsonschema.Draft202012Validator(schema, format_checker=checker).is_valid(instance)


def run(lines):
    tool = tool_path("grammar_check")
    stdin = "".join(json.dumps(line) + "\n" for line in lines)
    result = subprocess.run([str(tool)], input=stdin, capture_output=True, text=True, check=True, timeout=300)
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_matcher_agrees_with_jsonschema():
    cases = [(schema, doc) for schema, docs in CORPUS for doc in docs]
    assert len(cases) >= 100
    verdicts = run([{"kind": "json_schema", "spec": json.dumps(schema), "doc": doc} for schema, doc in cases])
    assert len(verdicts) == len(cases)
    mismatches = []
    valid = 0
    for (schema, doc), verdict in zip(cases, verdicts):
        assert "error" not in verdict, (schema, verdict)
        want = expected(schema, doc)
        valid += want
        if verdict["accept"] != want:
            mismatches.append((json.dumps(schema)[:80], doc, want))
    assert not mismatches, mismatches
    # Both verdicts are well represented.
    assert 40 <= valid <= len(cases) - 40


def test_unsupported_schemas_name_the_construct():
    schemas = {
        "patternProperties": {"type": "object", "patternProperties": {"^a": {}}, "additionalProperties": {}},
        "'not' (other than": {"not": {"minLength": 2}},
        "if": {"if": {"type": "string"}, "then": {"minLength": 1}},
        "multipleOf": {"type": "number", "multipleOf": 2},
        "uniqueItems": {"type": "array", "uniqueItems": True},
        "format 'hostname'": {"type": "string", "format": "hostname"},
    }
    verdicts = run([{"kind": "json_schema", "spec": json.dumps(s), "doc": "1"} for s in schemas.values()])
    for (construct, _), verdict in zip(schemas.items(), verdicts):
        assert construct in verdict.get("error", ""), (construct, verdict)


@pytest.mark.parametrize("kind,spec,accepted,rejected", [
    ("regex", r"\d{3}-[a-z]+", ["123-abc"], ["12-abc", "123-", "123-ABC"]),
    ("choice", json.dumps(["alpha", "beta", "al"]), ["alpha", "beta", "al"], ["alp", "gamma", ""]),
    ("grammar", 'root ::= "(" item ("," item)* ")"\nitem ::= [0-9]+', ["(1)", "(12,3)"], ["()", "(1,)", "1"]),
])
def test_other_kinds(kind, spec, accepted, rejected):
    docs = accepted + rejected
    verdicts = run([{"kind": kind, "spec": spec, "doc": d} for d in docs])
    assert [v["accept"] for v in verdicts] == [True] * len(accepted) + [False] * len(rejected)
