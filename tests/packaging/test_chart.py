"""The Helm chart (charts/flotilla) as a product: documented, validated, least-privilege.

Everything up to the helm section runs offline from the chart's files. The helm section needs
a `helm` binary (on PATH, or named by $HELM) and skips with that reason without one: it lints
the chart and renders every ci/ scenario, then validates each rendered manifest with
kubernetes-validate for the oldest Kubernetes the chart supports and the newest it knows.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "flotilla"
TEMPLATES = CHART / "templates"
SCENARIOS = sorted((CHART / "ci").glob("*.yaml"))
RESOURCE_TEMPLATES = sorted(TEMPLATES.glob("*.yaml"))
CRD = REPO / "crds" / "raftcluster.yaml"
CHART_CRD = CHART / "crds" / "raftcluster.yaml"
OLDEST_KUBERNETES = "1.29.0"  # Chart.yaml's kubeVersion: the CRD's CEL rules need it

# What the operator may do (the rules of templates/_helpers.tpl, "flotilla.rules", plus the
# ClusterRole's cluster-scoped reads): nothing more, nothing less.
EXPECTED_RULES: dict[tuple[str, str], set[str]] = {
    ("flotilla.dev", "raftclusters"): {"get", "list", "watch", "patch"},
    ("flotilla.dev", "raftclusters/status"): {"get", "patch"},
    ("apps", "statefulsets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "services"): {"get", "list", "watch", "create", "patch"},
    ("policy", "poddisruptionbudgets"): {"get", "list", "watch", "create", "patch"},
    ("", "pods"): {"get", "list", "watch", "delete"},
    ("batch", "jobs"): {"get", "list", "watch", "create", "delete"},
    ("batch", "cronjobs"): {"list", "create", "patch", "delete"},
    ("", "persistentvolumeclaims"): {"get", "list", "watch", "delete"},
    ("", "secrets"): {"get", "create", "patch"},
    ("networking.k8s.io", "networkpolicies"): {"get", "list", "watch", "create", "patch",
                                               "delete"},
    ("", "configmaps"): {"get", "list", "watch", "create", "patch"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "namespaces"): {"list", "watch"},
}
# Only what kopf needs to watch every namespace: a Role cannot grant it, and namespaced mode
# does without.
CLUSTER_SCOPED = {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces")}
# With rbac.certManager (spec.tls.issuerRef).
CERT_MANAGER_RULES = {("cert-manager.io", "certificates"): {"get", "create", "patch"}}


def load_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def leaf_paths(tree: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths to every leaf: scalars, lists and empty maps (a non-empty map is a branch)."""
    if isinstance(tree, dict) and tree:
        return [path for key, value in tree.items()
                for path in leaf_paths(value, (*prefix, str(key)))]
    return [prefix]


def documented_paths(text: str) -> set[tuple[str, ...]]:
    """Paths of the keys whose comment block, directly above them, holds a `# --` line
    (helm-docs' marker for a value's description)."""
    documented: set[tuple[str, ...]] = set()
    stack: list[tuple[int, str]] = []
    comments: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            comments = []
            continue
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        match = re.match(r"^( *)([A-Za-z0-9_.-]+):(\s|$)", line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match.group(2)))
            if any(comment.startswith("# --") for comment in comments):
                documented.add(tuple(key for _, key in stack))
        comments = []
    return documented


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of a -f file over values.yaml: maps merge, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def schema_validator() -> jsonschema.Draft7Validator:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def schema_errors(values: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in schema_validator().iter_errors(values)]


def rules_text() -> list[str]:
    """The lines of every RBAC rule the chart can grant: "flotilla.rules" in _helpers.tpl,
    then the ClusterRole's own (cluster-scoped) rules, indented alike."""
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    shared = helpers.split('{{- define "flotilla.rules" -}}\n', 1)[1].split("{{- end }}\n", 1)[0]
    own = (TEMPLATES / "clusterrole.yaml").read_text().split("\nrules:\n", 1)[1]
    return [*shared.splitlines(), *(line[2:] for line in own.splitlines() if "{{" not in line)]


def static_rules() -> list[dict[str, Any]]:
    """The rules, read from the templates (the rules hold no template code but conditions)."""
    return yaml.safe_load("\n".join(line for line in rules_text() if "{{" not in line))


def rules_as_grants(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    grants: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                grants.setdefault((group, resource), set()).update(rule["verbs"])
    return grants


# --- Chart.yaml -----------------------------------------------------------------------------


def test_chart_metadata_names_the_app_version_and_the_oldest_kubernetes():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "flotilla"
    assert chart["appVersion"] == project["version"] == "0.1.0"
    assert chart["kubeVersion"].startswith(">=1.29"), "the CRD's CEL rules need Kubernetes 1.29"


# --- values.yaml and values.schema.json -----------------------------------------------------


def test_every_value_is_documented_with_a_helm_docs_comment():
    values = load_values()
    documented = documented_paths((CHART / "values.yaml").read_text())
    undocumented = [".".join(p) for p in leaf_paths(values) if p not in documented]
    assert not undocumented, f"values without a `# --` comment right above them: {undocumented}"


def test_the_readme_values_table_lists_every_value():
    readme = (CHART / "README.md").read_text()
    table = {m for m in re.findall(r"^\| `([^`]+)` \|", readme, flags=re.MULTILINE)}
    missing = [".".join(p) for p in leaf_paths(load_values()) if ".".join(p) not in table]
    assert not missing, f"values missing from the README's values table: {missing}"
    extra = sorted(table - {".".join(p) for p in leaf_paths(load_values())})
    assert not extra, f"README documents values that values.yaml does not have: {extra}"


def test_replica_count_is_one_and_says_why():
    assert load_values()["replicaCount"] == 1
    block = re.search(r"((?:#[^\n]*\n)+)replicaCount: 1\n", (CHART / "values.yaml").read_text())
    assert block, "replicaCount: 1 needs its comment"
    assert "standalone" in block.group(1), "say why: kopf runs standalone, without peering"


@pytest.mark.parametrize("scenario", [None, *SCENARIOS],
                         ids=lambda s: "values.yaml" if s is None else s.name)
def test_values_and_each_ci_scenario_satisfy_the_schema(scenario):
    values = load_values()
    if scenario is not None:
        values = merged(values, yaml.safe_load(scenario.read_text()) or {})
    assert schema_errors(values) == []


def test_ci_scenarios_cover_default_namespaced_watch_and_custom_image():
    names = {s.name for s in SCENARIOS}
    assert {"default-values.yaml", "namespaced-watch-values.yaml",
            "custom-image-values.yaml"} <= names
    namespaced = yaml.safe_load((CHART / "ci" / "namespaced-watch-values.yaml").read_text())
    assert namespaced["operator"]["watchNamespaces"]
    custom = yaml.safe_load((CHART / "ci" / "custom-image-values.yaml").read_text())
    assert custom["image"]["repository"] != load_values()["image"]["repository"]
    assert custom["operator"]["defaultImage"]


@pytest.mark.parametrize(("override", "complaint"), [
    ({"replicaCount": 2}, "replicaCount"),
    ({"operator": {"verbose": "yes"}}, "operator.verbose"),
    ({"operator": {"reconcileIntervalSeconds": 0}}, "operator.reconcileIntervalSeconds"),
    ({"operator": {"watchNamespaces": ["Not_A_Namespace"]}}, "operator.watchNamespaces.0"),
    ({"operator": {"livenessPort": 0}}, "operator.livenessPort"),
    ({"image": {"pullPolicy": "Sometimes"}}, "image.pullPolicy"),
    ({"serviceAccount": {"create": False}}, "serviceAccount.name"),
    ({"resources": {"requests": {"memory": "lots"}}}, "resources.requests.memory"),
    ({"imagePullSecrets": ["regcred"]}, "imagePullSecrets.0"),
    ({"operater": {}}, "(top)"),
])
def test_the_schema_refuses_bad_values(override, complaint):
    errors = schema_errors(merged(load_values(), override))
    assert any(e.startswith(complaint + ":") for e in errors), errors


# --- templates --------------------------------------------------------------------------------


@pytest.mark.parametrize("template", RESOURCE_TEMPLATES, ids=lambda p: p.name)
def test_each_template_file_holds_one_resource_named_after_its_kind(template):
    """One resource per file; one per watched namespace (a `range` over them, each document
    after its `---`) is still one resource."""
    text = template.read_text()
    kinds = re.findall(r"^kind: *(\w+)", text, flags=re.MULTILINE)
    assert len(kinds) == 1, f"{template.name}: kinds {kinds}"
    separators = [m.start() for m in re.finditer(r"^---", text, flags=re.MULTILINE)]
    loop = text.find("{{- range $namespace := .Values.operator.watchNamespaces }}")
    assert all(0 <= loop < at for at in separators), f"{template.name}: --- outside a range"
    assert len(separators) <= 1
    assert template.stem == kinds[0].lower()


def test_the_chart_has_the_expected_files():
    assert {p.name for p in RESOURCE_TEMPLATES} == {
        "serviceaccount.yaml", "clusterrole.yaml", "clusterrolebinding.yaml", "deployment.yaml",
        "role.yaml", "rolebinding.yaml"}
    assert (TEMPLATES / "_helpers.tpl").is_file()
    assert (TEMPLATES / "NOTES.txt").is_file()
    notes = (TEMPLATES / "NOTES.txt").read_text()
    for step in ("kubectl apply -f examples/basic.yaml", "kubectl get raft",
                 "kubectl scale raft/NAME --replicas=5"):
        assert step in notes


def test_no_template_holds_the_crd():
    """CRDs live in crds/, which helm installs once and never deletes: a CRD in templates/
    would be removed on uninstall, taking every RaftCluster (and its volumes) with it."""
    for path in TEMPLATES.iterdir():
        assert "CustomResourceDefinition" not in path.read_text(), path.name


# --- RBAC -------------------------------------------------------------------------------------


def test_rbac_has_no_wildcards():
    for rule in static_rules():
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in "".join(rule[field]), rule
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule


def test_rbac_grants_exactly_what_the_operator_needs():
    assert rules_as_grants(static_rules()) == EXPECTED_RULES | CERT_MANAGER_RULES


def test_every_rbac_rule_is_justified_by_a_comment():
    lines = rules_text()
    assert len([line for line in lines if line.strip().startswith("- apiGroups:")]) == len(
        EXPECTED_RULES) + len(CERT_MANAGER_RULES)
    for number, line in enumerate(lines):
        if line.strip().startswith("- apiGroups:"):
            assert lines[number - 1].strip().startswith("#"), f"rule {number + 1}: {line}"


# --- the CRD --------------------------------------------------------------------------------


def test_the_chart_crd_is_the_top_level_crd_byte_for_byte():
    assert CRD.is_file(), "crds/raftcluster.yaml (the RaftCluster CRD) is missing"
    assert CHART_CRD.is_file(), (
        "charts/flotilla/crds/raftcluster.yaml is missing: cp crds/raftcluster.yaml "
        "charts/flotilla/crds/")
    assert CHART_CRD.read_bytes() == CRD.read_bytes(), (
        "the chart's CRD differs from crds/raftcluster.yaml: cp crds/raftcluster.yaml "
        "charts/flotilla/crds/")
    assert [p.name for p in CHART_CRD.parent.iterdir()] == ["raftcluster.yaml"]


def test_the_readme_writes_down_the_crd_upgrade_path():
    readme = (CHART / "README.md").read_text()
    assert "kubectl apply --server-side -f charts/flotilla/crds/" in readme
    assert "helm upgrade" in readme
    assert "kubectl delete crd raftclusters.flotilla.dev" in readme


# --- rendered with helm -----------------------------------------------------------------------


def helm_binary() -> str:
    """The helm binary to use; skips the calling test when there is none."""
    named = os.environ.get("HELM")
    binary = named if named and os.access(named, os.X_OK) else shutil.which("helm")
    if binary is None:
        pytest.skip("no helm binary: put one on PATH or set HELM=/path/to/helm (helm lint, "
                    "helm template and validation of the rendered manifests are not run)")
    return binary


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=60)


def helm(*args: str) -> str:
    done = run_helm(*args)
    assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


@cache
def rendered(scenario: Path) -> tuple[dict[str, Any], ...]:
    text = helm("template", "flotilla", str(CHART), "--namespace", "flotilla-system",
                "--kube-version", OLDEST_KUBERNETES, "--include-crds", "-f", str(scenario))
    return tuple(doc for doc in yaml.safe_load_all(text) if doc)


def only(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}s rendered"
    return found[0]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_helm_lint_passes(scenario):
    out = helm("lint", str(CHART), "--strict", "-f", str(scenario))
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, latest_version()])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_every_rendered_manifest_is_valid_kubernetes(scenario, version):
    docs = rendered(scenario)
    assert docs
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']} is invalid for Kubernetes "
                        f"{version}: {exc}")


def test_helm_refuses_kubernetes_older_than_1_29():
    done = run_helm("template", "flotilla", str(CHART), "--kube-version", "1.28.9")
    assert done.returncode != 0
    assert "kubeVersion" in done.stderr


@pytest.mark.parametrize("setting", ["replicaCount=2", "operator.verbose=yes",
                                     "serviceAccount.create=false"])
def test_helm_refuses_bad_values_through_the_schema(setting):
    done = run_helm("template", "flotilla", str(CHART), "--kube-version", OLDEST_KUBERNETES,
                    "--set", setting)
    assert done.returncode != 0
    assert setting.split("=")[0].split(".")[0] in done.stderr


def test_the_default_render_runs_one_hardened_kopf_operator_clusterwide():
    docs = rendered(CHART / "ci" / "default-values.yaml")
    crd = only(docs, "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "raftclusters.flotilla.dev"
    deployment = only(docs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["flotilla", "operator"]
    assert "--all-namespaces" in container["args"]
    assert "--interval=30" in container["args"]
    assert "--verbose" not in container["args"]
    (liveness,) = [a for a in container["args"] if a.startswith("--liveness=")]
    port = int(re.fullmatch(r"--liveness=http://0\.0\.0\.0:(\d+)/healthz", liveness).group(1))
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    assert {p["name"]: p["containerPort"] for p in container["ports"]}[probe["port"]] == port
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FLOTILLA_DEFAULT_IMAGE"] == container["image"] == "flotilla:0.1.0"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    account = only(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["serviceAccountName"] == account
    binding = only(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == only(docs, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                    "namespace": "flotilla-system"}]
    assert rules_as_grants(only(docs, "ClusterRole")["rules"]) == EXPECTED_RULES
    assert not [doc for doc in docs if doc["kind"] in ("Role", "RoleBinding")]
    # Where the operator runs reaches every cluster's NetworkPolicy: its namespace and labels.
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["FLOTILLA_OPERATOR_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    labels = dict(term.split("=") for term in env["FLOTILLA_OPERATOR_POD_LABELS"].split(","))
    assert labels == deployment["spec"]["selector"]["matchLabels"]
    assert labels.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_the_operator_pod_is_not_selected_as_a_raft_member():
    """Members are selected by name=flotilla plus instance=<cluster>: a RaftCluster named like
    the release must not count the operator's pod in its PodDisruptionBudget."""
    docs = rendered(CHART / "ci" / "default-values.yaml")
    labels = only(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] != "flotilla"


def test_a_namespaced_watch_lists_its_namespaces_and_uses_the_given_account():
    docs = rendered(CHART / "ci" / "namespaced-watch-values.yaml")
    assert {doc["kind"] for doc in docs} == {"Deployment", "CustomResourceDefinition"}
    pod = only(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--all-namespaces" not in container["args"]
    assert [a for a in container["args"] if a.startswith("--namespace=")] == [
        "--namespace=team-a", "--namespace=team-b"]
    assert "--verbose" in container["args"]
    assert pod["serviceAccountName"] == "flotilla-operator"


def test_a_custom_image_reaches_the_operator_and_the_default_member_image():
    docs = rendered(CHART / "ci" / "custom-image-values.yaml")
    pod = only(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/platform/flotilla:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FLOTILLA_DEFAULT_IMAGE"] == (
        "registry.example.com/platform/flotilla-node:0.1.0-rc1")
    assert "--verbose" in container["args"]
    assert "--interval=2.5" in container["args"]
    assert "--liveness=http://0.0.0.0:9090/healthz" in container["args"]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_the_operator_accepts_the_rendered_arguments(scenario):
    """The chart's args and env are `flotilla operator`'s own flags: a flag it does not know
    would crash-loop the pod (argparse exits 2)."""
    operator_main = pytest.importorskip("flotilla.operator.main",
                                        reason="flotilla operator's CLI is not written yet")
    (container,) = only(rendered(scenario), "Deployment")["spec"]["template"]["spec"][
        "containers"]
    args = operator_main.build_parser().parse_args(container["args"])
    assert args.liveness.endswith("/healthz")
    assert args.namespace == yaml.safe_load(scenario.read_text()).get(
        "operator", {}).get("watchNamespaces", [])
    # ...and the environment variable it reads its default member image from.
    assert "FLOTILLA_DEFAULT_IMAGE" in {e["name"] for e in container["env"]}
    assert "FLOTILLA_DEFAULT_IMAGE" in Path(operator_main.__file__).read_text()


def test_the_namespaced_mode_grants_a_role_in_each_watched_namespace_and_nothing_clusterwide():
    docs = rendered(CHART / "ci" / "namespaced-rbac-values.yaml")
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds == ["CustomResourceDefinition", "Deployment", "Role", "Role", "RoleBinding",
                     "RoleBinding", "ServiceAccount"]
    account = only(docs, "ServiceAccount")["metadata"]["name"]
    roles = {doc["metadata"]["namespace"]: doc for doc in docs if doc["kind"] == "Role"}
    bindings = {doc["metadata"]["namespace"]: doc for doc in docs if doc["kind"] == "RoleBinding"}
    assert set(roles) == set(bindings) == {"team-a", "team-b"}
    namespaced = {key: verbs for key, verbs in EXPECTED_RULES.items()
                  if key not in CLUSTER_SCOPED}
    for namespace, role in roles.items():
        assert rules_as_grants(role["rules"]) == namespaced | CERT_MANAGER_RULES
        binding = bindings[namespace]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": role["metadata"]["name"]}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                        "namespace": "flotilla-system"}]
    (container,) = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [a for a in container["args"] if a.startswith("--namespace")] == [
        "--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in container["args"]
    # ...and the operator then runs without cluster-wide scanning, which a Role cannot grant
    operator_main = pytest.importorskip("flotilla.operator.main")
    assert operator_main.build_parser().parse_args(container["args"]).namespace == [
        "team-a", "team-b"]


def test_the_cert_manager_rule_is_granted_only_when_asked():
    default = rules_as_grants(only(rendered(CHART / "ci" / "default-values.yaml"),
                                   "ClusterRole")["rules"])
    assert ("cert-manager.io", "certificates") not in default


def test_a_namespace_pattern_cannot_be_given_a_role():
    done = run_helm("template", "flotilla", str(CHART), "--kube-version", OLDEST_KUBERNETES,
                    "--set", "operator.watchNamespaces={team-*}")
    assert done.returncode != 0
    assert '"team-*" is a pattern, and a Role needs a namespace' in done.stderr
    # with RBAC of one's own, kopf's globs are fine
    done = run_helm("template", "flotilla", str(CHART), "--kube-version", OLDEST_KUBERNETES,
                    "--set", "operator.watchNamespaces={team-*}", "--set", "rbac.create=false")
    assert done.returncode == 0, done.stderr


def test_the_readme_says_that_writing_raftclusters_is_privileged():
    readme = " ".join((CHART / "README.md").read_text().split()).lower()
    assert "**write access to raftclusters is privileged.**" in readme
    assert "image they choose" in readme and "credentials" in readme
    values = " ".join(line.lstrip("# ") for line in (CHART / "values.yaml").read_text()
                      .splitlines()).lower()
    assert "write access to raftclusters is privileged" in values
