"""docs/crd-reference.md is written from the CRD by tools/crd_reference.py: the committed page
must be what the tool writes from the committed CRD, name every field the schema has, and link
only to sections it has; the tool must also read the shapes a schema may grow (maps, free-form
objects, lists of objects: Kubernetes' pod options)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("crd_reference", REPO / "tools" /
                                                  "crd_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL = _tool()


def test_the_committed_reference_is_what_the_crd_gives() -> None:
    page = TOOL.PAGE.read_text() if TOOL.PAGE.is_file() else ""
    assert page == TOOL.render(TOOL.load()), (
        "docs/crd-reference.md is out of date with crds/raftcluster.yaml: run "
        f"`{TOOL.COMMAND}` and commit the result")


def _fields(path: str, schema: dict[str, Any]):
    for name, child in (schema.get("properties") or {}).items():
        if path == "" and name == "metadata":
            continue
        yield path, name
        yield from _fields(f"{path}.{name}" if path else name, child)
    if isinstance(schema.get("items"), dict):
        yield from _fields(f"{path}[]", schema["items"])


def _sections(page: str) -> dict[str, str]:
    parts = re.split(r"^### `([^`]+)`$", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_field_of_the_schema_is_in_its_objects_table() -> None:
    root = TOOL.load()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    sections = _sections(TOOL.render(TOOL.load()))
    missing = [f"{path}.{name}" for path, name in _fields("", root)
               if path and f"| `{name}`" not in sections.get(path, "")]
    assert not missing, missing
    assert {"spec", "spec.archive.compaction", "status.requests.moveLeader",
            "status.conditions[]"} <= set(sections)


def _links_resolve(page: str) -> None:
    anchors = {TOOL._anchor(title) for title in _sections(page)}
    links = set(re.findall(r"\]\(#([^)]+)\)", page))
    assert links, "no links at all"
    assert links <= anchors, sorted(links - anchors)


def test_links_go_to_sections_of_the_page() -> None:
    _links_resolve(TOOL.render(TOOL.load()))


def test_the_shapes_of_pod_options_are_described() -> None:
    """Maps, free-form objects, lists of free-form and of typed objects, int-or-string."""
    crd = TOOL.load()
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["pod"] = {"type": "object", "description": "Pod | options.", "properties": {
        "nodeSelector": {"type": "object", "description": "Node labels.",
                         "additionalProperties": {"type": "string"}},
        "affinity": {"type": "object", "description": "Affinity.",
                     "x-kubernetes-preserve-unknown-fields": True},
        "tolerations": {"type": "array", "maxItems": 1, "description": "Tolerations.",
                        "items": {"type": "object",
                                  "x-kubernetes-preserve-unknown-fields": True}},
        "topologySpreadConstraints": {"type": "array", "description": "Spread.", "items": {
            "type": "object", "required": ["maxSkew"], "properties": {
                "maxSkew": {"type": "integer", "format": "int32", "minimum": 1,
                            "description": "Skew."},
                "when": {"type": "string", "enum": ["a", "b"], "description": "When."}}}},
        "budget": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"},
                                                                  {"type": "string"}],
                   "description": "Either."},
    }}
    page = TOOL.render(crd)
    pod = _sections(page)["spec.pod"]
    rows = {line.split(" | ")[0].strip("| `"): line for line in pod.splitlines()
            if line.startswith("| `")}
    assert "| map of string |" in rows["nodeSelector"]
    assert "| object (free-form) |" in rows["affinity"]
    assert "| array of object (free-form) |" in rows["tolerations"]
    assert "| at most 1 item |" in rows["tolerations"]
    assert "| array of [object](#specpodtopologyspreadconstraints) |" in rows[
        "topologySpreadConstraints"]
    assert "| integer or string |" in rows["budget"]
    assert "| Pod \\| options. |" in _sections(page)["spec"], \
        "a | in a description would split the table row"
    spread = _sections(page)["spec.pod.topologySpreadConstraints[]"]
    assert "| `maxSkew` (required) | integer (int32) |  | at least 1 |" in spread
    assert '| one of `"a"`, `"b"` |' in spread
    _links_resolve(page)
