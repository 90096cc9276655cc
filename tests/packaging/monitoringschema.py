"""The Prometheus Operator's PodMonitor and PrometheusRule (monitoring.coreos.com/v1), as far as
the chart writes them, for validating rendered manifests offline.

kubernetes-validate knows only the API server's own kinds, and the Prometheus Operator's CRDs
are not installed here. These schemas are written from its API reference: every field the
chart sets or a user may pass through (a PodMonitor endpoint's tlsConfig), typed, with unknown
fields refused at every level the chart controls, so that a misspelt or misplaced field fails
here instead of being pruned (or refused) by the API server. Fields the chart never renders
are left out: a chart change that starts using one extends this module.
"""

from __future__ import annotations

from typing import Any

import jsonschema

GROUP_VERSION = "monitoring.coreos.com/v1"

_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
               r"(([0-9]+)ms)?)$",
}
_LABEL_NAME = {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_NAME = {"type": "string", "minLength": 1, "maxLength": 253,
         "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"}

_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": _NAME,
        "namespace": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                      "maxLength": 63},
        "labels": {"type": "object",
                   "additionalProperties": {"type": "string", "maxLength": 63}},
        "annotations": _STRING_MAP,
    },
}

_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "properties": {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {"type": "array", "items": {
            "type": "object",
            "additionalProperties": False,
            "required": ["key", "operator"],
            "properties": {
                "key": {"type": "string"},
                "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                "values": {"type": "array", "items": {"type": "string"}},
            },
        }},
    },
}

_SECRET_KEY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["key"],
    "properties": {"name": {"type": "string"}, "key": {"type": "string", "minLength": 1},
                   "optional": {"type": "boolean"}},
}
_SECRET_OR_CONFIGMAP = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"secret": _SECRET_KEY, "configMap": _SECRET_KEY},
}
_SAFE_TLS_CONFIG = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "ca": _SECRET_OR_CONFIGMAP,
        "cert": _SECRET_OR_CONFIGMAP,
        "keySecret": _SECRET_KEY,
        "serverName": {"type": "string"},
        "insecureSkipVerify": {"type": "boolean"},
    },
}

_RELABEL_ACTIONS = ["replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep",
                    "lowercase", "uppercase", "keepequal", "dropequal"]
_RELABEL_CONFIG = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": _LABEL_NAME},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer", "minimum": 0},
        "replacement": {"type": "string"},
        "action": {"enum": _RELABEL_ACTIONS + [a.capitalize() for a in _RELABEL_ACTIONS]
                   + ["HashMod", "LabelMap", "LabelDrop", "LabelKeep", "KeepEqual",
                      "DropEqual"]},
    },
}

_POD_METRICS_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["port"],
    "properties": {
        "port": {"type": "string", "minLength": 1},
        "path": {"type": "string", "pattern": "^/"},
        "scheme": {"enum": ["http", "https"]},
        "interval": _DURATION,
        "scrapeTimeout": _DURATION,
        "tlsConfig": _SAFE_TLS_CONFIG,
        "honorLabels": {"type": "boolean"},
        "honorTimestamps": {"type": "boolean"},
        "relabelings": {"type": "array", "items": _RELABEL_CONFIG},
        "metricRelabelings": {"type": "array", "items": _RELABEL_CONFIG},
    },
}

POD_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": GROUP_VERSION},
        "kind": {"const": "PodMonitor"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "podMetricsEndpoints"],
            "properties": {
                "jobLabel": {"type": "string"},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "minProperties": 1,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "minItems": 1,
                                       "items": {"type": "string", "minLength": 1}},
                    },
                },
                "podMetricsEndpoints": {"type": "array", "minItems": 1,
                                        "items": _POD_METRICS_ENDPOINT},
            },
        },
    },
}

_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["expr"],
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
    "properties": {
        "alert": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
        "record": {"type": "string", "pattern": r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
        "expr": {"type": "string", "minLength": 1},
        "for": _DURATION,
        "keep_firing_for": _DURATION,
        "labels": {"type": "object", "propertyNames": _LABEL_NAME,
                   "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "propertyNames": _LABEL_NAME,
                        "additionalProperties": {"type": "string"}},
    },
}

PROMETHEUS_RULE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": GROUP_VERSION},
        "kind": {"const": "PrometheusRule"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {
                "groups": {"type": "array", "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name", "rules"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "interval": _DURATION,
                        "rules": {"type": "array", "minItems": 1, "items": _RULE},
                    },
                }},
            },
        },
    },
}

SCHEMAS = {"PodMonitor": POD_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


def covers(doc: dict[str, Any]) -> bool:
    """Whether `doc` is one of the Prometheus Operator's kinds (and so not
    kubernetes-validate's)."""
    return str(doc.get("apiVersion", "")).startswith("monitoring.coreos.com/")


def problems(doc: dict[str, Any]) -> list[str]:
    """What is wrong with a PodMonitor or PrometheusRule, one line each (empty: nothing)."""
    schema = SCHEMAS.get(doc.get("kind", ""))
    if schema is None or doc.get("apiVersion") != GROUP_VERSION:
        return [f"{doc.get('apiVersion')} {doc.get('kind')} is not a kind this module knows"]
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in validator.iter_errors(doc)]
