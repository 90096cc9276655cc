"""spec.pod: where and how the member pods run, read and checked as the API server would.

The fields carry a PodSpec's own names (imagePullSecrets, serviceAccountName, nodeSelector,
tolerations, affinity, topologySpreadConstraints, priorityClassName) plus the pod template's
metadata (labels, annotations), so what a user knows from Deployments applies unchanged. The
API server checks the StatefulSet the operator renders from them only when the operator
writes it, and its refusal would reach nobody but the operator's log; so every rule it would
apply is checked here first, and a mistake becomes one sentence naming the field.

Pure: the standard library only. `spec.py` reads the section through `parse`, whose
`PodOptionError` it turns into its own `SpecError`.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The labels the operator puts on every member pod and selects them by (StatefulSet,
# Services, budget, NetworkPolicy, the watches), and the ones the StatefulSet controller sets:
# spec.pod.metadata.labels may not name any of them.
RESERVED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component",
    "controller-revision-hash",
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
)
# Where members spread when spec.pod.topologySpreadConstraints is unset: across zones, then
# across nodes, one member at most ahead of the others, as a preference (ScheduleAnyway), so
# a one-node or zoneless cluster still schedules every member.
DEFAULT_SPREAD_KEYS = ("topology.kubernetes.io/zone", "kubernetes.io/hostname")
MAX_ANNOTATIONS_BYTES = 256 * 1024  # the API server's limit on a pod's annotations

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_NODE_OPERATORS = (*_SELECTOR_OPERATORS, "Gt", "Lt")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_INTEGER = re.compile(r"[+-]?[0-9]+")


class PodOptionError(ValueError):
    """A field of spec.pod the API server would refuse; the message names it and the fix."""


@dataclass(frozen=True)
class PodOptions:
    """spec.pod, checked; each mapping or list as the pod template takes it."""

    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    image_pull_secrets: tuple[str, ...] = ()
    service_account_name: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] | None = None
    # None: DEFAULT_SPREAD_KEYS; () means none at all (the user's explicit empty list)
    topology_spread_constraints: tuple[dict[str, Any], ...] | None = None
    priority_class_name: str | None = None

    def spread(self, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        """The member pods' topologySpreadConstraints: the spec's (a constraint without a
        labelSelector counts this cluster's members), or the default soft spread."""
        members = {"matchLabels": dict(selector)}
        if self.topology_spread_constraints is None:
            return [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
                     "labelSelector": copy.deepcopy(members)} for key in DEFAULT_SPREAD_KEYS]
        out = []
        for constraint in self.topology_spread_constraints:
            constraint = copy.deepcopy(constraint)
            constraint.setdefault("labelSelector", copy.deepcopy(members))
            out.append(constraint)
        return out

    def placement(self) -> dict[str, Any]:
        """What every pod of the cluster gets, the pipeline Jobs' too: pull secrets, service
        account, priority, and where it may run (nodeSelector, tolerations, node affinity).
        Pod (anti-)affinity and spreading concern members among themselves: not here."""
        out: dict[str, Any] = {}
        if self.image_pull_secrets:
            out["imagePullSecrets"] = [{"name": name} for name in self.image_pull_secrets]
        if self.service_account_name is not None:
            out["serviceAccountName"] = self.service_account_name
        if self.priority_class_name is not None:
            out["priorityClassName"] = self.priority_class_name
        if self.node_selector:
            out["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            out["tolerations"] = copy.deepcopy(list(self.tolerations))
        node_affinity = (self.affinity or {}).get("nodeAffinity")
        if node_affinity:
            out["affinity"] = {"nodeAffinity": copy.deepcopy(node_affinity)}
        return out

    def member_pod(self, selector: Mapping[str, str]) -> dict[str, Any]:
        """The member pod's share: `placement`, the whole affinity, and the spread."""
        out = self.placement()
        if self.affinity:
            out["affinity"] = copy.deepcopy(self.affinity)
        spread = self.spread(selector)
        if spread:
            out["topologySpreadConstraints"] = spread
        return out


def parse(values: object, path: str = "spec.pod") -> PodOptions:
    """spec.pod as given (None: every default); raises PodOptionError for the first mistake."""
    pod = _object(values, path)
    _known(pod, path, ("metadata", "imagePullSecrets", "serviceAccountName", "nodeSelector",
                       "tolerations", "affinity", "topologySpreadConstraints",
                       "priorityClassName"))
    metadata = _object(pod.get("metadata"), f"{path}.metadata")
    _known(metadata, f"{path}.metadata", ("labels", "annotations"))
    spread = pod.get("topologySpreadConstraints")
    return PodOptions(
        labels=_labels(metadata.get("labels"), f"{path}.metadata.labels"),
        annotations=_annotations(metadata.get("annotations"), f"{path}.metadata.annotations"),
        image_pull_secrets=_pull_secrets(pod.get("imagePullSecrets"),
                                         f"{path}.imagePullSecrets"),
        service_account_name=_object_name(pod.get("serviceAccountName"),
                                          f"{path}.serviceAccountName", "a ServiceAccount"),
        node_selector=_string_map(pod.get("nodeSelector"), f"{path}.nodeSelector",
                                  "node label"),
        tolerations=tuple(_toleration(t, f"{path}.tolerations[{i}]")
                          for i, t in enumerate(_list(pod.get("tolerations"),
                                                      f"{path}.tolerations"))),
        affinity=_affinity(pod.get("affinity"), f"{path}.affinity"),
        topology_spread_constraints=None if spread is None else _spread(
            spread, f"{path}.topologySpreadConstraints"),
        priority_class_name=_object_name(pod.get("priorityClassName"),
                                         f"{path}.priorityClassName", "a PriorityClass"),
    )


# --- metadata -------------------------------------------------------------------------------


def _labels(value: object, where: str) -> dict[str, str]:
    labels = _string_map(value, where, "pod label")
    reserved = sorted(set(labels) & set(RESERVED_LABELS))
    if reserved:
        raise PodOptionError(
            f"{where} must not set {', '.join(reserved)}: the operator sets "
            f"{'it' if len(reserved) == 1 else 'them'} on every member pod and selects members "
            "by them; use labels of your own")
    return labels


def _annotations(value: object, where: str) -> dict[str, str]:
    annotations = _object(value, where)
    for key, text in annotations.items():
        _qualified_name(key, f"{where} key {key!r}")
        if not isinstance(text, str):
            raise PodOptionError(f'{where}.{key} must be a string (quote it: "{text}")')
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        raise PodOptionError(f"{where} hold {size} bytes: at most {MAX_ANNOTATIONS_BYTES} "
                             "(256 KiB) in all")
    return dict(annotations)


def _string_map(value: object, where: str, what: str) -> dict[str, str]:
    """A map of label names to label values (labels, nodeSelector, matchLabels)."""
    out = _object(value, where)
    for key, text in out.items():
        _qualified_name(key, f"{where} key {key!r}")
        _label_value(text, f"{where}.{key}", what)
    return dict(out)


def _qualified_name(key: object, where: str) -> str:
    """A label or annotation key: an optional DNS subdomain prefix and '/', then a name of at
    most 63 characters."""
    text = key if isinstance(key, str) else ""
    prefix, slash, name = text.rpartition("/")
    if (not isinstance(key, str) or not _NAME_PART.fullmatch(name) or len(name) > 63
            or (slash and (not _DNS_SUBDOMAIN.fullmatch(prefix) or len(prefix) > 253))):
        raise PodOptionError(
            f"{where} is not a valid key: an optional DNS prefix and '/' (such as "
            "example.com/), then at most 63 characters of letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit")
    return text


def _label_value(value: object, where: str, what: str = "label") -> str:
    if not isinstance(value, str):
        raise PodOptionError(f'{where} must be a string (quote it: "{value}")')
    if value and (len(value) > 63 or not _NAME_PART.fullmatch(value)):
        raise PodOptionError(
            f"{where} ({value!r}) is not a valid {what} value: at most 63 characters of "
            "letters, digits, '-', '_' and '.', starting and ending with a letter or digit")
    return value


# --- names and lists ------------------------------------------------------------------------


def _object_name(value: object, where: str, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value):
        raise PodOptionError(f"{where} must name {what}: a-z, 0-9, '-' and '.', at most 253 "
                             f"characters, not {value!r}")
    return value


def _pull_secrets(value: object, where: str) -> tuple[str, ...]:
    names = []
    for i, item in enumerate(_list(value, where)):
        if not isinstance(item, Mapping) or set(item) != {"name"}:
            raise PodOptionError(f"{where}[{i}] must be {{name: SECRET}}, a Secret of type "
                                 f"kubernetes.io/dockerconfigjson, not {item!r}")
        names.append(_object_name(item["name"], f"{where}[{i}].name", "a Secret"))
    if len(set(names)) != len(names):
        raise PodOptionError(f"{where} names a Secret twice")
    return tuple(n for n in names if n is not None)


def _toleration(value: object, where: str) -> dict[str, Any]:
    """The API server's rules for a toleration: operator Equal (the default) or Exists; no
    value with Exists; no key (every taint) only with Exists; tolerationSeconds only with
    effect NoExecute."""
    item = _object(value, where)
    _known(item, where, ("key", "operator", "value", "effect", "tolerationSeconds"))
    key = item.get("key") or ""
    if key:
        _qualified_name(key, f"{where}.key")
    operator = _choice(item, "operator", ("Equal", "Exists"), where)
    effect = _choice(item, "effect", ("", *_TAINT_EFFECTS), where)
    value_text = item.get("value")
    if value_text is not None:
        _label_value(value_text, f"{where}.value", "taint")
    if operator == "Exists" and value_text:
        raise PodOptionError(f"{where}: operator Exists takes no value (it matches the taint "
                             "whatever its value); remove value, or use operator Equal")
    if not key and operator != "Exists":
        raise PodOptionError(f"{where} has no key, which tolerates every taint: that needs "
                             "operator: Exists; or give the taint's key")
    seconds = item.get("tolerationSeconds")
    if seconds is not None:
        if not isinstance(seconds, int) or isinstance(seconds, bool):
            raise PodOptionError(f"{where}.tolerationSeconds must be a whole number of "
                                 f"seconds, not {seconds!r}")
        if effect != "NoExecute":
            raise PodOptionError(f"{where}.tolerationSeconds goes with effect NoExecute (how "
                                 "long the pod stays on a node so tainted); set that effect, "
                                 "or remove tolerationSeconds")
    return _without_nulls(item)


def _spread(value: object, where: str) -> tuple[dict[str, Any], ...]:
    constraints = []
    seen: set[tuple[str, str]] = set()
    for i, item in enumerate(_list(value, where)):
        at = f"{where}[{i}]"
        c = _object(item, at)
        _known(c, at, ("maxSkew", "topologyKey", "whenUnsatisfiable", "labelSelector",
                       "minDomains", "nodeAffinityPolicy", "nodeTaintsPolicy",
                       "matchLabelKeys"))
        _positive(c, "maxSkew", at, required=True)
        if c.get("topologyKey") in (None, ""):
            raise PodOptionError(f"{at}.topologyKey is required: a node label such as "
                                 "topology.kubernetes.io/zone or kubernetes.io/hostname")
        _qualified_name(c["topologyKey"], f"{at}.topologyKey")
        if c.get("whenUnsatisfiable") is None:
            raise PodOptionError(f"{at}.whenUnsatisfiable is required: DoNotSchedule (a "
                                 "rule) or ScheduleAnyway (a preference)")
        when = _choice(c, "whenUnsatisfiable", ("DoNotSchedule", "ScheduleAnyway"), at)
        if _positive(c, "minDomains", at) is not None and when != "DoNotSchedule":
            raise PodOptionError(f"{at}.minDomains goes with whenUnsatisfiable: DoNotSchedule")
        _choice(c, "nodeAffinityPolicy", ("Honor", "Ignore"), at)
        _choice(c, "nodeTaintsPolicy", ("Honor", "Ignore"), at)
        _keys(c.get("matchLabelKeys"), f"{at}.matchLabelKeys")
        if "labelSelector" in c:
            _label_selector(c["labelSelector"], f"{at}.labelSelector")
        pair = (c["topologyKey"], when)
        if pair in seen:
            raise PodOptionError(f"{at} repeats topologyKey {pair[0]} with whenUnsatisfiable "
                                 f"{pair[1]}: give each pair once")
        seen.add(pair)
        constraints.append(_without_nulls(c))
    return tuple(constraints)


# --- affinity -------------------------------------------------------------------------------


def _affinity(value: object, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    affinity = _object(value, where)
    _known(affinity, where, ("nodeAffinity", "podAffinity", "podAntiAffinity"))
    if "nodeAffinity" in affinity:
        _node_affinity(affinity["nodeAffinity"], f"{where}.nodeAffinity")
    for kind in ("podAffinity", "podAntiAffinity"):
        if kind in affinity:
            _pod_affinity(affinity[kind], f"{where}.{kind}")
    return _without_nulls(affinity) or None


_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _node_affinity(value: object, where: str) -> None:
    node = _object(value, where)
    _known(node, where, (_REQUIRED, _PREFERRED))
    if node.get(_REQUIRED) is not None:
        at = f"{where}.{_REQUIRED}"
        required = _object(node[_REQUIRED], at)
        _known(required, at, ("nodeSelectorTerms",))
        terms = _list(required.get("nodeSelectorTerms"), f"{at}.nodeSelectorTerms")
        if not terms:
            raise PodOptionError(f"{at}.nodeSelectorTerms must list at least one term (a pod "
                                 "may run on a node matching any of them)")
        for i, term in enumerate(terms):
            _node_selector_term(term, f"{at}.nodeSelectorTerms[{i}]")
    for i, item in enumerate(_list(node.get(_PREFERRED), f"{where}.{_PREFERRED}")):
        at = f"{where}.{_PREFERRED}[{i}]"
        preferred = _weighted(item, at, "preference")
        _node_selector_term(preferred["preference"], f"{at}.preference")


def _node_selector_term(value: object, where: str) -> None:
    term = _object(value, where)
    _known(term, where, ("matchExpressions", "matchFields"))
    for i, req in enumerate(_list(term.get("matchExpressions"), f"{where}.matchExpressions")):
        _requirement(req, f"{where}.matchExpressions[{i}]", _NODE_OPERATORS)
    for i, req in enumerate(_list(term.get("matchFields"), f"{where}.matchFields")):
        at = f"{where}.matchFields[{i}]"
        values = _requirement(req, at, ("In", "NotIn"))
        if req.get("key") != "metadata.name" or len(values) != 1:
            raise PodOptionError(f"{at} must be key metadata.name with exactly one value (a "
                                 "node's name): the only field nodes are selected by")


def _pod_affinity(value: object, where: str) -> None:
    pod = _object(value, where)
    _known(pod, where, (_REQUIRED, _PREFERRED))
    for i, term in enumerate(_list(pod.get(_REQUIRED), f"{where}.{_REQUIRED}")):
        _pod_affinity_term(term, f"{where}.{_REQUIRED}[{i}]")
    for i, item in enumerate(_list(pod.get(_PREFERRED), f"{where}.{_PREFERRED}")):
        at = f"{where}.{_PREFERRED}[{i}]"
        _pod_affinity_term(_weighted(item, at, "podAffinityTerm")["podAffinityTerm"],
                           f"{at}.podAffinityTerm")


def _pod_affinity_term(value: object, where: str) -> None:
    term = _object(value, where)
    _known(term, where, ("labelSelector", "namespaceSelector", "namespaces", "topologyKey",
                         "matchLabelKeys", "mismatchLabelKeys"))
    if term.get("topologyKey") in (None, ""):
        raise PodOptionError(f"{where}.topologyKey is required: the node label whose values "
                             "make the domains, such as kubernetes.io/hostname")
    _qualified_name(term["topologyKey"], f"{where}.topologyKey")
    for key in ("labelSelector", "namespaceSelector"):
        if term.get(key) is not None:
            _label_selector(term[key], f"{where}.{key}")
    for i, namespace in enumerate(_list(term.get("namespaces"), f"{where}.namespaces")):
        if not isinstance(namespace, str) or not re.fullmatch(_DNS_LABEL, namespace) \
                or len(namespace) > 63:
            raise PodOptionError(f"{where}.namespaces[{i}] must be a namespace's name, not "
                                 f"{namespace!r}")
    for key in ("matchLabelKeys", "mismatchLabelKeys"):
        _keys(term.get(key), f"{where}.{key}")


def _weighted(value: object, where: str, inner: str) -> Mapping[str, Any]:
    item = _object(value, where)
    _known(item, where, ("weight", inner))
    weight = item.get("weight")
    if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
        raise PodOptionError(f"{where}.weight must be a whole number from 1 to 100, not "
                             f"{weight!r}")
    if item.get(inner) is None:
        raise PodOptionError(f"{where}.{inner} is required")
    return item


def _label_selector(value: object, where: str) -> None:
    selector = _object(value, where)
    _known(selector, where, ("matchLabels", "matchExpressions"))
    _string_map(selector.get("matchLabels"), f"{where}.matchLabels", "label")
    for i, req in enumerate(_list(selector.get("matchExpressions"),
                                  f"{where}.matchExpressions")):
        _requirement(req, f"{where}.matchExpressions[{i}]", _SELECTOR_OPERATORS)


def _requirement(value: object, where: str, operators: tuple[str, ...]) -> list[str]:
    """A selector requirement: a key, an operator, and values as the operator needs them."""
    req = _object(value, where)
    _known(req, where, ("key", "operator", "values"))
    if req.get("key") in (None, ""):
        raise PodOptionError(f"{where}.key is required")
    _qualified_name(req["key"], f"{where}.key")
    operator = req.get("operator")
    if operator not in operators:
        raise PodOptionError(f"{where}.operator must be {', '.join(operators[:-1])} or "
                             f"{operators[-1]}, not {operator!r}")
    values = _list(req.get("values"), f"{where}.values")
    if not all(isinstance(v, str) for v in values):
        raise PodOptionError(f"{where}.values must be strings (quote numbers), not {values!r}")
    if operator in ("In", "NotIn") and not values:
        raise PodOptionError(f"{where}: {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise PodOptionError(f"{where}: {operator} takes no values")
    if operator in ("Gt", "Lt") and (len(values) != 1 or not _INTEGER.fullmatch(values[0])):
        raise PodOptionError(f"{where}: {operator} takes exactly one value, a whole number "
                             'written as a string (such as "3")')
    return list(values)


# --- reading --------------------------------------------------------------------------------


def _object(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PodOptionError(f"{where} must be an object, not {_shown(value)}")
    return {k: v for k, v in value.items() if v is not None}  # null counts as absent


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PodOptionError(f"{where} must be a list, not {_shown(value)}")
    return value


def _known(item: Mapping[str, Any], where: str, keys: tuple[str, ...]) -> None:
    unknown = sorted(set(item) - set(keys))
    if unknown:
        raise PodOptionError(f"{where} has {', '.join(map(str, unknown))}, which "
                             f"{'is' if len(unknown) == 1 else 'are'} not a field there: it "
                             f"takes {', '.join(keys)}")


def _choice(item: Mapping[str, Any], key: str, choices: tuple[str, ...], where: str) -> str:
    value = item.get(key)
    if value is None:
        return choices[0]
    if value not in choices:
        shown = " or ".join(repr(c) if c == "" else c for c in choices)
        raise PodOptionError(f"{where}.{key} must be {shown}, not {value!r}")
    return value


def _positive(item: Mapping[str, Any], key: str, where: str, required: bool = False) -> int | None:
    value = item.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PodOptionError(f"{where}.{key} must be a whole number of at least 1, not "
                             f"{value!r}")
    return value


def _keys(value: object, where: str) -> None:
    for i, key in enumerate(_list(value, where)):
        _qualified_name(key, f"{where}[{i}]")


def _without_nulls(value: Any) -> Any:
    """A deep copy without null fields, which the API server reads as absent."""
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _shown(value: object) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
