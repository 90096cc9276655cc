"""Growing the members' volumes to spec.storage.size.

A StatefulSet's volumeClaimTemplates cannot change once it exists, so, as CloudNativePG does
with its own claims, the operator leaves the template at the size the cluster started with and
resizes each member's PersistentVolumeClaim itself: it raises `spec.resources.requests.storage`
and the storage driver grows the volume (and the file system) while the member runs. A claim
the StatefulSet makes later, for a new member, starts at the template's size and is grown the
same way in the next round.

Only growing: a volume cannot shrink, so a smaller size is refused, never applied. Only where
the claim's StorageClass sets `allowVolumeExpansion: true`: otherwise nothing is patched and
the condition says what to do. Where the operator may not read StorageClasses (they are
cluster-scoped: a namespaced operator's Role cannot grant them), it patches anyway and reports
the API server's refusal the same way.

The outcome is the `VolumesResized` condition: True once every member's claim requests the
spec's size and (where the claim reports it) has that capacity; False while the volumes grow
(`Resizing`), and False with a reason in `STUCK` when only the user can settle it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from .kube import ApiError, Kube
from .spec import ClusterSpec, parse_quantity

CONDITION = "VolumesResized"
# Reasons of a False VolumesResized that no round can change: the cluster is Stalled.
STUCK = ("ShrinkRefused", "ExpansionNotAllowed", "StorageClassMissing", "ResizeRefused")
# The conditions a claim reports while (or because) its volume does not grow yet.
_CLAIM_CONDITIONS = ("ControllerResizeError", "NodeResizeError", "FileSystemResizePending",
                     "Resizing")
Event = tuple[str, str, str]


@dataclass(frozen=True)
class Sizing:
    """What the round found and did: the condition (None while no member has a claim yet),
    and the Events of the claims patched or refused."""

    condition: tuple[bool, str, str] | None
    events: tuple[Event, ...] = ()

    @property
    def stuck(self) -> bool:
        return self.condition is not None and not self.condition[0] \
            and self.condition[1] in STUCK


def keep_claim_template(statefulset: dict[str, Any],
                        current: Mapping[str, Any] | None) -> dict[str, Any]:
    """The rendered StatefulSet with the volume claim template's size of the one that exists:
    the API server refuses any change to volumeClaimTemplates, and an apply carries them."""
    if current is None:
        return statefulset
    kept = [_request(t) for t in (current.get("spec") or {}).get("volumeClaimTemplates") or []]
    for template, size in zip(statefulset["spec"]["volumeClaimTemplates"], kept, strict=False):
        if size is not None:
            template["spec"]["resources"]["requests"]["storage"] = size
    return statefulset


def resize(kube: Kube, spec: ClusterSpec, claims: Sequence[Mapping[str, Any]]) -> Sizing:
    """Compare each member claim with spec.storage.size and grow the smaller ones, where the
    StorageClass allows it. `claims`: the PersistentVolumeClaims of the current members."""
    if not claims:
        return Sizing(None)
    size = spec.storage.size
    want = parse_quantity(size)
    sizes = {_name(c): _request(c) for c in claims}
    larger = sorted(n for n, s in sizes.items() if s is not None and _value(s) > want)
    below = [c for c in claims if (s := sizes[_name(c)]) is not None and _value(s) < want]
    # The API server resizes bound claims only; one still unbound is grown once it is bound.
    smaller = [c for c in below if (c.get("status") or {}).get("phase") in (None, "Bound")]
    unbound = [_name(c) for c in below if c not in smaller]
    events: list[Event] = []
    refused: tuple[bool, str, str] | None = None
    if smaller:
        refused = _expansion_refused(kube, spec, smaller)
        if refused is None:
            patched = []
            for claim in smaller:
                try:
                    kube.patch("PersistentVolumeClaim", spec.namespace, _name(claim),
                               {"spec": {"resources": {"requests": {"storage": size}}}})
                except ApiError as exc:
                    if exc.status not in (400, 403, 422):
                        raise
                    refused = (False, "ResizeRefused", f"the API server refused to grow "
                               f"{_name(claim)} to {size}: {exc}. Set spec.storage.size back "
                               f"to {sizes[_name(claim)]}, or fix what it says")
                    break
                patched.append(f"{_name(claim)} {sizes[_name(claim)]} -> {size}")
            if patched:
                events.append(("Normal", "VolumesResizing",
                               f"spec.storage.size is {size}: {', '.join(patched)}"))
        if refused is not None:
            events.append(("Warning", refused[1], refused[2]))
    if larger:
        message = (f"spec.storage.size ({size}) is smaller than "
                   f"{', '.join(f'{n} ({sizes[n]})' for n in larger)}, and a volume cannot "
                   "shrink: nothing is shrunk. Set spec.storage.size to at least "
                   f"{max((sizes[n] for n in larger), key=_value)}")
        events.append(("Warning", "ShrinkRefused", message))
        return Sizing((False, "ShrinkRefused", message), tuple(events))
    if refused is not None:
        return Sizing(refused, tuple(events))
    growing = [g for c in claims if (g := _growing(c, size)) is not None]
    if unbound:
        growing.append(f"{', '.join(unbound)} not bound yet: grown to {size} once bound")
    if growing or smaller:
        return Sizing((False, "Resizing", "; ".join(growing) if growing else
                       f"the member volumes are asked to grow to {size}"), tuple(events))
    return Sizing((True, "Resized", f"every member volume requests {size}"), tuple(events))


def _expansion_refused(kube: Kube, spec: ClusterSpec,
                       claims: Sequence[Mapping[str, Any]]) -> tuple[bool, str, str] | None:
    """Why the claims' StorageClasses cannot grow them, or None when they can (or when the
    operator may not read StorageClasses: the API server then decides)."""
    names = ", ".join(_name(c) for c in claims)
    current = _request(claims[0])
    back = f"set spec.storage.size back to {current}"
    for class_name in sorted({(c.get("spec") or {}).get("storageClassName") or ""
                              for c in claims}):
        if not class_name:
            return (False, "ExpansionNotAllowed", f"no StorageClass provisions {names}, and "
                    f"only a class's provisioner can grow a volume: {back}, or restore the "
                    "archive into a new RaftCluster with the size you need")
        try:
            storage_class = kube.get("StorageClass", "", class_name)
        except ApiError as exc:
            if exc.status in (401, 403):
                continue
            raise
        if storage_class is None:
            return (False, "StorageClassMissing", f"StorageClass {class_name} of {names} does "
                    f"not exist, so nothing can grow them: {back}")
        if storage_class.get("allowVolumeExpansion") is not True:
            return (False, "ExpansionNotAllowed", f"StorageClass {class_name} does not allow "
                    f"volume expansion (allowVolumeExpansion is not true), so {names} stay at "
                    f"{current}: {back}, or, if its provisioner can grow volumes, set "
                    f"allowVolumeExpansion: true on the class")
    return None


def _growing(claim: Mapping[str, Any], size: str) -> str | None:
    """How far the claim's volume is from `size`, in words, while it is: its capacity, and
    the reason the claim gives (the driver's error, a file system waiting for its pod)."""
    status = claim.get("status") or {}
    capacity = (status.get("capacity") or {}).get("storage")
    if capacity is None or _value(str(capacity)) >= parse_quantity(size):
        return None
    said = [f"{c['type']}: {c.get('message') or c.get('reason') or ''}".rstrip(": ")
            for c in status.get("conditions") or []
            if c.get("type") in _CLAIM_CONDITIONS and c.get("status") == "True"]
    return f"{_name(claim)} has {capacity} of {size}" + (f" ({'; '.join(said)})" if said
                                                          else "")


def _name(claim: Mapping[str, Any]) -> str:
    return str((claim.get("metadata") or {}).get("name"))


def _request(claim: Mapping[str, Any]) -> str | None:
    value = (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get(
        "storage")
    return None if value is None else str(value)


def _value(quantity: str) -> Decimal:
    try:
        return parse_quantity(quantity)
    except ValueError:
        return Decimal(0)
