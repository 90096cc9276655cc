"""What the API server does with a RaftCluster, without an API server.

A CRD's schema is only exercised when a cluster admits an object, which makes a broken rule or
a forgotten default a surprise for the first user. This module replays the API server's steps
for a custom resource, in its order, so that tests can admit objects offline:

1. status subresource: a create drops `status`, an update keeps the stored one, and a status
   update keeps everything but `status` from the stored object;
2. pruning: fields the schema does not declare are removed, and reported as
   `kubectl --validate=strict` (server-side strict field validation) reports them;
3. defaulting: `default`s of missing properties whose parent exists, recursively;
4. OpenAPI validation (types, enums, bounds, patterns), through `jsonschema`;
5. CEL rules (`x-kubernetes-validations`) through `celpy`, skipped when step 4 found an error
   that makes them meaningless (wrong type, missing required field), as the API server does;
   transition rules (those reading `oldSelf`) only run on update, where an old value exists.

Messages follow the API server's wording (Kubernetes 1.30) so that tests read like what users
will see. Not covered: CEL cost estimation, validation ratcheting, `format` checks, list-map
key uniqueness and ObjectMeta (the API server checks it for every kind, not through the CRD).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml
from celpy.adapter import json_to_cel

# jsonschema keywords that mean the same in OpenAPI v3 (a draft 4 dialect) as in JSON Schema.
_KEYWORDS = {
    "type", "enum", "required", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minLength", "maxLength", "pattern", "minItems", "maxItems", "uniqueItems",
    "minProperties", "maxProperties", "anyOf", "allOf", "oneOf", "not",
}
# The errors after which the API server does not run CEL rules (its hasBlockingErr): a rule
# written against the schema's types would otherwise fail for the wrong reason.
_BLOCKING = {"type", "required", "enum", "maxLength", "maxItems", "maxProperties"}
_SKIPPED_CEL = (
    "some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation"
)
# The API server finds `oldSelf` in the compiled rule; a word match is the same for our rules.
_OLD_SELF = re.compile(r"\boldSelf\b")


def load_crd(path: str | Path) -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text())


def version_schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            return served["schema"]["openAPIV3Schema"]
    raise KeyError(f"{crd['metadata']['name']} has no version {version}")


def iter_schemas(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (path, node) for every schema reachable through properties, items and maps.

    `anyOf` branches are not yielded: in a structural schema they only restate types (as for
    int-or-string) and carry neither descriptions nor defaults.
    """
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from iter_schemas(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), dict):
        yield from iter_schemas(node["items"], f"{path}[*]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from iter_schemas(node["additionalProperties"], f"{path}[*]")


def to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """Translate the Kubernetes dialect of OpenAPI v3 into plain JSON Schema (draft 4)."""
    out = {key: value for key, value in node.items() if key in _KEYWORDS}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    for key in ("anyOf", "allOf", "oneOf"):
        if key in out:
            out[key] = [to_json_schema(branch) for branch in out[key]]
    if "properties" in node:
        out["properties"] = {k: to_json_schema(v) for k, v in node["properties"].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), dict):
            out[key] = to_json_schema(node[key])
    return out


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _child(node: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The schema of field `key` of an object: a declared property, else the map's values."""
    extra = node.get("additionalProperties")
    return node.get("properties", {}).get(key, extra if isinstance(extra, dict) else None)


def _keeps_unknown(node: dict[str, Any], path: str) -> bool:
    # ObjectMeta is validated by the API server for every kind, not through the CRD's schema.
    return bool(node.get("x-kubernetes-preserve-unknown-fields")) or path == "metadata"


def prune(value: Any, node: dict[str, Any], path: str = "") -> list[str]:
    """Remove undeclared fields (and nulls of non-nullable ones) in place; report the former."""
    errors = []
    if isinstance(value, dict) and not _keeps_unknown(node, path):
        for key in list(value):
            child = _child(node, key)
            if child is None and not node.get("additionalProperties"):
                errors.append(f'unknown field "{_join(path, key)}"')
                del value[key]
            elif value[key] is None and child is not None and not child.get("nullable"):
                del value[key]
            elif child is not None:
                errors += prune(value[key], child, _join(path, key))
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            errors += prune(item, node["items"], _join(path, i))
    return errors


def apply_defaults(value: Any, node: dict[str, Any]) -> None:
    """Fill in defaults like the API server: a missing property of an existing object gets its
    default, then every value (defaulted or not) is defaulted in turn, so `storage: {}` brings
    `storage.size` with it while an absent optional object stays absent."""
    if isinstance(value, dict):
        props = node.get("properties", {})
        for key, child in props.items():
            if "default" in child and key not in value:
                value[key] = copy.deepcopy(child["default"])
        for key, item in value.items():
            if (child := _child(node, key)) is not None:
                apply_defaults(item, child)
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for item in value:
            apply_defaults(item, node["items"])


def _render(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, (dict, list)) else f'"{_kind(value)}"'


def _kind(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string",
             dict: "object", list: "array", type(None): "null"}
    return names[type(value)]


def _schema_message(error: jsonschema.ValidationError) -> list[str]:
    path = ""
    for key in error.absolute_path:
        path = _join(path, key)
    value, limit, kind = error.instance, error.validator_value, error.validator
    if kind == "required":
        return [f"{_join(path, name)}: Required value" for name in limit if name not in value]
    if kind == "type":
        wanted = " or ".join([limit] if isinstance(limit, str) else limit)
        return [f'{path}: Invalid value: "{_kind(value)}": {path} in body must be of type '
                f'{wanted}: "{_kind(value)}"']
    if kind == "enum":
        allowed = ", ".join(json.dumps(v) for v in limit)
        return [f"{path}: Unsupported value: {_render(value)}: supported values: {allowed}"]
    if kind == "maxLength":
        return [f"{path}: Too long: may not be longer than {limit}"]
    if kind in ("maxItems", "maxProperties"):
        return [f"{path}: Too many: {len(value)}: must have at most {limit} items"]
    if kind == "minimum" and error.schema.get("exclusiveMinimum"):
        kind = "exclusiveMinimum"
    wording = {
        "minimum": f"should be greater than or equal to {limit}",
        "exclusiveMinimum": f"should be greater than {limit}",
        "maximum": f"should be less than or equal to {limit}",
        "pattern": f"should match '{limit}'",
        "minLength": f"should be at least {limit} chars long",
    }.get(kind, error.message)
    return [f"{path}: Invalid value: {_render(value)}: {path} in body {wording}"]


class CRDValidator:
    """Admits objects of one version of a CRD the way the API server would."""

    def __init__(self, crd: dict[str, Any], version: str) -> None:
        self.schema = version_schema(crd, version)
        self._openapi = jsonschema.Draft4Validator(to_json_schema(self.schema))
        self._cel = celpy.Environment()
        self._programs: dict[str, celpy.Runner] = {}
        self._has_status = any(
            "status" in v.get("subresources", {}) for v in crd["spec"]["versions"]
        )

    def admit(
        self, obj: dict[str, Any], old: dict[str, Any] | None = None, subresource: str = ""
    ) -> tuple[dict[str, Any], list[str]]:
        """Return the object as it would be stored, and the errors that would reject it."""
        obj = copy.deepcopy(obj)
        if old is not None:
            old = copy.deepcopy(old)
            prune(old, self.schema)
            apply_defaults(old, self.schema)
        if self._has_status and old is None:
            obj.pop("status", None)
        elif self._has_status and subresource == "status":
            obj = {**copy.deepcopy(old), "status": obj.get("status")}
        elif self._has_status:
            obj["status"] = copy.deepcopy(old.get("status"))
        obj = {k: v for k, v in obj.items() if v is not None}
        errors = prune(obj, self.schema)
        apply_defaults(obj, self.schema)
        schema_errors = sorted(
            self._openapi.iter_errors(obj), key=lambda e: [str(p) for p in e.path]
        )
        for error in schema_errors:
            errors += _schema_message(error)
        if any(error.validator in _BLOCKING for error in schema_errors):
            return obj, [*errors, _SKIPPED_CEL]
        errors += self._check_rules(self.schema, obj, old, old is not None, "")
        return obj, errors

    def _check_rules(
        self, node: dict[str, Any], value: Any, old: Any, has_old: bool, path: str
    ) -> list[str]:
        errors = []
        for rule in node.get("x-kubernetes-validations", []):
            transition = bool(_OLD_SELF.search(rule["rule"]))
            if transition and not has_old:
                continue
            activation = {"self": json_to_cel(value)}
            if transition:
                activation["oldSelf"] = json_to_cel(old)
            where = (path + rule.get("fieldPath", "")).lstrip(".") or "<nil>"  # the root
            shown = f'"{_kind(value)}"'
            try:
                result = self._program(rule["rule"]).evaluate(activation)
            except celpy.CELEvalError as error:
                result = error
            if isinstance(result, celpy.CELEvalError):
                errors.append(f"{where}: Invalid value: {shown}: {rule['rule']}: {result}")
            elif not result:
                message = rule.get("message", f"failed rule: {rule['rule']}")
                errors.append(f"{where}: Invalid value: {shown}: {message}")
        # Old values are matched by field name only: rules under lists never see oldSelf, as
        # with the API server's atomic lists.
        if isinstance(value, dict):
            for key, item in value.items():
                if (child := _child(node, key)) is not None:
                    found = has_old and isinstance(old, dict) and key in old
                    old_item = old[key] if found else None
                    errors += self._check_rules(child, item, old_item, found, _join(path, key))
        elif isinstance(value, list) and isinstance(node.get("items"), dict):
            for i, item in enumerate(value):
                errors += self._check_rules(node["items"], item, None, False, _join(path, i))
        return errors

    def _program(self, rule: str) -> celpy.Runner:
        if rule not in self._programs:
            self._programs[rule] = self._cel.program(self._cel.compile(rule))
        return self._programs[rule]
