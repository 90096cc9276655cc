"""Write docs/crd-reference.md, the RaftCluster API reference, from the CRD's own schema.

    .venv/bin/python tools/crd_reference.py            # rewrite docs/crd-reference.md
    .venv/bin/python tools/crd_reference.py --check    # exit 1 if it is out of date

Everything in the page comes from crds/raftcluster.yaml: the names, the printer columns, and
for every object of the schema (spec, status and each object below them) one table of its
fields with their type, default, validation and description, then the CEL rules the API server
checks there. Nothing is written by hand, so the page is what `kubectl explain` would say, all
in one place; tests/packaging/test_crd_reference.py fails when the committed page differs
from what this writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CRD_FILE = REPO / "crds" / "raftcluster.yaml"
PAGE = REPO / "docs" / "crd-reference.md"
COMMAND = ".venv/bin/python tools/crd_reference.py"

Schema = Mapping[str, Any]


def load(path: Path = CRD_FILE) -> dict[str, Any]:
    with open(path) as f:
        return yaml.safe_load(f)


def render(crd: Mapping[str, Any]) -> str:
    """The whole page, as markdown."""
    spec = crd["spec"]
    names = spec["names"]
    out = [
        f"# {names['kind']} API reference",
        "",
        f"<!-- Written by tools/crd_reference.py from crds/raftcluster.yaml: do not edit by "
        f"hand; run `{COMMAND}` after changing the CRD. -->",
        "",
        f"Every field of the `{names['kind']}` custom resource, as the CRD "
        "(`crds/raftcluster.yaml`) defines and validates it: what `kubectl explain "
        f"{names['plural']}.spec --recursive` shows, in one page. "
        "[operator.md](operator.md) explains what the operator does with them.",
        "",
    ]
    for version in spec["versions"]:
        out += _version(spec, version)
    return "\n".join(out).rstrip() + "\n"


def _version(crd_spec: Mapping[str, Any], version: Mapping[str, Any]) -> list[str]:
    names = crd_spec["names"]
    group = crd_spec["group"]
    sub = version.get("subresources") or {}
    scale = sub.get("scale")
    facts = [
        ("API version", f"`{group}/{version['name']}`"
         + (" (served)" if version.get("served") else " (not served)")
         + (", the storage version" if version.get("storage") else "")),
        ("kind", f"`{names['kind']}` (list: `{names.get('listKind', names['kind'] + 'List')}`)"),
        ("names", ", ".join(f"`{n}`" for n in [names["plural"], names.get("singular"),
                                                *(names.get("shortNames") or [])] if n)),
        ("categories", ", ".join(f"`{c}`" for c in names.get("categories") or []) or "none"),
        ("scope", crd_spec["scope"]),
        ("subresources", ", ".join(
            [*(["`status`"] if "status" in sub else []),
             *([f"`scale` (`{scale['specReplicasPath']}`, `{scale['statusReplicasPath']}`, "
                f"selector `{scale.get('labelSelectorPath', '-')}`)"] if scale else [])])
         or "none"),
    ]
    out = [f"## {group}/{version['name']}", "", "| | |", "| --- | --- |"]
    out += [f"| {label} | {_cell(value)} |" for label, value in facts]
    columns = version.get("additionalPrinterColumns") or []
    if columns:
        out += ["", f"`kubectl get {names['plural']}` shows:", "",
                "| column | type | from | description |", "| --- | --- | --- | --- |"]
        out += [f"| {c['name']} | {c['type']} | `{c['jsonPath']}` | "
                f"{_cell(c.get('description', ''))} |" for c in columns]
    root = version["schema"]["openAPIV3Schema"]
    out.append("")
    for path, schema in _objects("", root):
        if not path:
            continue
        out += _section(path, schema)
    return out


def _objects(path: str, schema: Schema) -> Iterator[tuple[str, Schema]]:
    """Every object of the schema that has fields of its own, depth first, in the order the
    CRD lists them; an array of such objects is the path with `[]`."""
    if schema.get("properties"):
        yield path, schema
        for name, child in schema["properties"].items():
            if path == "" and name == "metadata":
                continue
            yield from _objects(_join(path, name), child)
    items = schema.get("items")
    if isinstance(items, Mapping):
        yield from _objects(f"{path}[]", items)
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping):
        yield from _objects(f"{path}[*]", extra)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _anchor(path: str) -> str:
    """The anchor GitHub gives the heading `### path`."""
    return "".join(ch for ch in path.lower() if ch.isalnum() or ch in "-_")


def _section(path: str, schema: Schema) -> list[str]:
    out = [f"### `{path}`", ""]
    if schema.get("description"):
        out += [_text(schema["description"]), ""]
    required = set(schema.get("required") or [])
    out += ["| field | type | default | validation | description |",
            "| --- | --- | --- | --- | --- |"]
    for name, child in schema["properties"].items():
        if path == "" and name == "metadata":
            continue
        field = f"`{name}`" + (" (required)" if name in required else "")
        default = f"`{_json(child['default'])}`" if "default" in child else ""
        out.append(f"| {field} | {_type(_join(path, name), child)} | {_cell(default)} | "
                   f"{_cell(_validation(child))} | {_cell(_text(child.get('description', '')))} |")
    rules = schema.get("x-kubernetes-validations") or []
    if rules:
        out += ["", "Rules the API server checks here:", ""]
        for rule in rules:
            message = rule.get("message") or rule.get("messageExpression") or "(no message)"
            out.append(f"- {_text(message)} (`{_text(rule['rule'])}`)")
    out.append("")
    return out


def _type(path: str, schema: Schema) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "integer or string"
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items") or {}
        inner = _type(f"{path}[]", items)
        return f"array of {inner}"
    if kind == "object" or "properties" in schema:
        if schema.get("properties"):
            return f"[object](#{_anchor(path)})"
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            return f"map of {_type(f'{path}[*]', extra)}"
        return "object (free-form)" if schema.get("x-kubernetes-preserve-unknown-fields") \
            else "object"
    if "anyOf" in schema:
        return " or ".join(sorted({str(option.get("type", "?")) for option in schema["anyOf"]}))
    if kind is None:
        return "any"
    fmt = schema.get("format")
    return f"{kind} ({fmt})" if fmt else str(kind)


_LIMITS = [
    ("minimum", "at least {}", ""), ("maximum", "at most {}", ""),
    ("minLength", "at least {}", "character"), ("maxLength", "at most {}", "character"),
    ("minItems", "at least {}", "item"), ("maxItems", "at most {}", "item"),
    ("minProperties", "at least {}", "entry"), ("maxProperties", "at most {}", "entry"),
]
_PLURALS = {"character": "characters", "item": "items", "entry": "entries"}


def _validation(schema: Schema) -> str:
    parts = []
    if "enum" in schema:
        parts.append("one of " + ", ".join(f"`{_json(v)}`" for v in schema["enum"]))
    for key, words, unit in _LIMITS:
        value = schema.get(key)
        if value is None or isinstance(value, bool):  # (a boolean: OpenAPI 3.0's exclusive*)
            continue
        if key == "minimum" and schema.get("exclusiveMinimum") is True:
            words = "more than {}"
        elif key == "maximum" and schema.get("exclusiveMaximum") is True:
            words = "less than {}"
        noun = unit if value == 1 else _PLURALS.get(unit, unit)
        parts.append(f"{words.format(value)} {noun}".rstrip())
    if "pattern" in schema:
        parts.append(f"matches `{schema['pattern']}`")
    if schema.get("x-kubernetes-list-type"):
        keys = schema.get("x-kubernetes-list-map-keys")
        parts.append(f"list type {schema['x-kubernetes-list-type']}"
                     + (f" (keys {', '.join(keys)})" if keys else ""))
    return "; ".join(parts)


def _text(text: str) -> str:
    return " ".join(str(text).split())


def _json(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "), sort_keys=True)


def _cell(text: str) -> str:
    """Text that keeps a markdown table row whole."""
    return text.replace("|", "\\|")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if {PAGE.relative_to(REPO)} is not what would be written")
    args = parser.parse_args(argv)
    page = render(load())
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != page:
            print(f"{PAGE.relative_to(REPO)} is out of date with crds/raftcluster.yaml: run "
                  f"`{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
