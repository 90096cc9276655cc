"""The chart's monitoring: PodMonitors, the PrometheusRule and the Grafana dashboard.

What they select is compared with what the operator renders (the member pods' labels and
ports) and what the chart's Deployment runs; every metric they read must be one the members or
the operator export (docs/metrics.md, and the families agreed for the metrics work, listed
below). The alerts go through promtool: `check rules` on the rendered PrometheusRule and `test
rules` on alerts_test.yaml, whose cases make each alert fire for the series it is meant for
and stay quiet for the others. promtool comes from Debian's `prometheus` package (or
$PROMTOOL); without it those tests skip and say so. Rendering needs helm, as in
test_chart.py.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from flotilla.operator import render
from flotilla.operator.spec import ClusterSpec

from tests.operator.test_spec import body
from tests.packaging import monitoringschema
from tests.packaging.test_chart import CHART, REPO, helm, load_values, only, rendered

ALERTS = CHART / "monitoring" / "alerts.yaml"
DASHBOARD = CHART / "monitoring" / "dashboard.json"
RUNBOOKS = REPO / "docs" / "runbooks.md"
MONITORING = CHART / "ci" / "monitoring-values.yaml"
ALERTS_TEST = Path(__file__).with_name("alerts_test.yaml")

# The families the members and the operator export beside those docs/metrics.md lists: the
# names agreed for the metrics work (etcd's families under flotilla_, the operator's own), and
# prometheus_client's process collector. Histograms are named by their family; their _bucket,
# _sum and _count series are accepted with them.
AGREED_METRICS = {
    "flotilla_server_has_leader", "flotilla_server_is_leader",
    "flotilla_server_leader_changes_seen_total", "flotilla_server_proposals_committed_total",
    "flotilla_server_proposals_applied_total", "flotilla_server_proposals_failed_total",
    "flotilla_server_proposals_pending", "flotilla_build_info", "flotilla_server_voters",
    "flotilla_server_learners", "flotilla_server_learner_lag_entries",
    "flotilla_archive_lag_entries", "flotilla_archive_errors_total",
    "flotilla_archive_last_archived_index", "flotilla_tls_certificate_expiry_timestamp_seconds",
    "flotilla_operator_reconcile_errors_total", "flotilla_operator_steps_total",
    "flotilla_operator_clusters", "flotilla_operator_cluster_voters",
    "flotilla_operator_cluster_unavailable_voters", "flotilla_operator_cluster_fault_tolerance",
    "flotilla_operator_cluster_ready", "process_cpu_seconds_total",
    "process_resident_memory_bytes",
}
AGREED_HISTOGRAMS = {
    "flotilla_disk_wal_fsync_duration_seconds", "flotilla_server_apply_duration_seconds",
    "flotilla_network_peer_round_trip_time_seconds", "flotilla_http_request_duration_seconds",
    "flotilla_operator_reconcile_duration_seconds",
}


def documented_metrics() -> tuple[set[str], set[str]]:
    """Families in docs/metrics.md's tables: (all of them, the histograms)."""
    names: set[str] = set()
    histograms: set[str] = set()
    for row in re.finditer(r"^\| `((?:flotilla|process|python)_[a-z0-9_]+)[^`]*` \| (\w+)",
                           (REPO / "docs" / "metrics.md").read_text(), flags=re.MULTILINE):
        names.add(row.group(1))
        if row.group(2) == "histogram":
            histograms.add(row.group(1))
    return names, histograms


def unknown_metrics(expr: str) -> set[str]:
    """Series an expression reads that no member or operator exports."""
    names, histograms = documented_metrics()
    names |= AGREED_METRICS | AGREED_HISTOGRAMS
    histograms |= AGREED_HISTOGRAMS
    unknown = set()
    for name in re.findall(r"\b((?:flotilla|process|python)_[a-zA-Z0-9_]*)", expr):
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        if name not in names and not (family != name and family in histograms):
            unknown.add(name)
    return unknown


def promtool() -> str:
    named = os.environ.get("PROMTOOL")
    binary = named if named and os.access(named, os.X_OK) else shutil.which("promtool")
    if binary is None:
        pytest.skip("no promtool: install Debian's prometheus package (apt-get install "
                    "prometheus) or set PROMTOOL=/path/to/promtool; the alerts and the "
                    "dashboard's queries are not checked by Prometheus itself")
    return binary


def run_promtool(*args: str, cwd: Path) -> str:
    done = subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@cache
def _all_alerts_text() -> str:
    return helm("template", "flotilla", str(CHART), "-s", "templates/prometheusrule.yaml",
                "--set", "monitoring.prometheusRule.enabled=true")


def all_alerts() -> dict[str, Any]:
    """The PrometheusRule with every alert (only the rule switched on), a fresh copy."""
    return yaml.safe_load(_all_alerts_text())


def rules_of(rule: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def alert_names() -> list[str]:
    return [r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


CLUSTER = "orders"


def member_pods() -> dict[str, dict[str, Any]]:
    """Pod templates the operator renders for the RaftCluster CLUSTER with an archive, a
    point-in-time restore and scheduled jobs: its members' and its Jobs'."""
    spec = ClusterSpec.from_body(body({
        "replicas": 3,
        "archive": {"url": "s3://backups/orders", "compaction": {"schedule": "0 3 * * *"}},
        "bootstrap": {"restore": {"url": "s3://old/orders", "clusterId": "orders-1",
                                  "index": 900}},
    }, name=CLUSTER))
    members = spec.member_names(3)
    return {
        "member": render.statefulset(spec, members, False, 3)["spec"]["template"],
        "restore": render.restore_job(spec)["spec"]["template"],
        "compaction": render.archive_cronjob(spec, "compaction")["spec"]["jobTemplate"][
            "spec"]["template"],
    }


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, "only matchLabels selectors are compared here"
    return selector["matchLabels"].items() <= labels.items()


# --- PodMonitors ------------------------------------------------------------------------------


def test_the_member_podmonitor_scrapes_the_client_port_of_member_pods_only():
    monitor = next(doc for doc in rendered(MONITORING) if doc["kind"] == "PodMonitor"
                   and doc["metadata"]["name"].endswith("-members"))
    pods = member_pods()
    member = pods["member"]
    assert selects(monitor["spec"]["selector"], member["metadata"]["labels"])
    for job in ("restore", "compaction"):
        assert not selects(monitor["spec"]["selector"], pods[job]["metadata"]["labels"]), job
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = member["spec"]["containers"]
    assert endpoint["port"] in {p["name"] for p in container["ports"]}
    assert endpoint["port"] == "client" and endpoint["path"] == "/metrics"
    # raftcluster is the RaftCluster's name, from the pod label that carries it
    (relabel,) = endpoint["relabelings"]
    assert relabel["targetLabel"] == "raftcluster"
    (source,) = relabel["sourceLabels"]
    label = next(k for k in member["metadata"]["labels"]
                 if "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k) == source)
    assert member["metadata"]["labels"][label] == CLUSTER
    # the scenario verifies certificates against a shared CA, with a client certificate
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["serverName"] == "localhost"
    assert endpoint["tlsConfig"]["keySecret"] == {"name": "flotilla-metrics-tls",
                                                  "key": "tls.key"}
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_member_podmonitor_speaks_https_by_default_as_members_do():
    """RaftClusters run TLS unless spec.tls.enabled is false; their certificates cannot be
    verified without a CA they share, so by default they are not."""
    (container,) = member_pods()["member"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert load_values()["monitoring"]["podMonitors"]["members"]["scheme"] == "https"
    text = helm("template", "flotilla", str(CHART), "-s", "templates/podmonitor-members.yaml",
                "--set", "monitoring.podMonitors.members.enabled=true",
                "--set", "monitoring.podMonitors.members.scheme=http")
    (endpoint,) = yaml.safe_load(text)["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "http" and "tlsConfig" not in endpoint


def test_a_namespaced_operator_s_members_are_scraped_in_its_namespaces_only():
    text = helm("template", "flotilla", str(CHART), "-s", "templates/podmonitor-members.yaml",
                "-f", str(CHART / "ci" / "namespaced-rbac-values.yaml"),
                "--set", "monitoring.podMonitors.members.enabled=true")
    assert yaml.safe_load(text)["spec"]["namespaceSelector"] == {
        "matchNames": ["team-a", "team-b"]}


def test_the_operator_podmonitor_scrapes_the_operator_s_metrics_port():
    docs = rendered(MONITORING)
    monitor = next(doc for doc in docs if doc["kind"] == "PodMonitor"
                   and doc["metadata"]["name"].endswith("-operator"))
    pod = only(docs, "Deployment")["spec"]["template"]
    assert selects(monitor["spec"]["selector"], pod["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["flotilla-system"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = pod["spec"]["containers"]
    assert endpoint["port"] == "metrics"
    assert "metrics" in {p["name"] for p in container["ports"]}
    # the operator's per-cluster series keep their own namespace label
    assert endpoint["honorLabels"] is True


@pytest.mark.parametrize(("kind", "path", "value"), [
    ("PodMonitor", ("spec", "podMetricsEndpoints", 0, "scheme"), "HTTPS"),
    ("PodMonitor", ("spec", "podMetricsEndpoints", 0, "tlsConfig", "caFile"), "/etc/ca.crt"),
    ("PodMonitor", ("spec", "podMetricEndpoints"), []),
    ("PodMonitor", ("spec", "podMetricsEndpoints", 0, "interval"), "30 seconds"),
    ("PodMonitor", ("spec", "namespaceSelector", "matchNames"), "team-a"),
    ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "for"), "a minute"),
    ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "record"), "also_a_record"),
    ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "labels", "severity"), 2),
])
def test_the_monitoring_schema_refuses_what_the_api_server_would(kind, path, value):
    doc = copy.deepcopy(next(d for d in rendered(MONITORING) if d["kind"] == kind))
    assert monitoringschema.problems(doc) == []
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert monitoringschema.problems(doc), f"{kind} with {path} = {value!r} passed"


# --- the PrometheusRule -----------------------------------------------------------------------


def test_every_alert_has_a_severity_a_summary_and_a_runbook_section():
    rules = rules_of(all_alerts())
    assert [r["alert"] for r in rules] == alert_names()
    headings = re.findall(r"^## (\w+)$", RUNBOOKS.read_text(), flags=re.MULTILINE)
    base = load_values()["monitoring"]["prometheusRule"]["runbookBaseURL"]
    for rule in rules:
        name = rule["alert"]
        assert name.startswith("Flotilla"), name
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert rule["annotations"]["runbook_url"] == f"{base}#{name.lower()}"
        assert name in headings, f"docs/runbooks.md has no section `## {name}`"
    assert set(headings) == set(alert_names()), "runbook sections for alerts that do not exist"


def test_the_rendered_rules_are_alerts_yaml_plus_runbook_links():
    shipped = yaml.safe_load(ALERTS.read_text())["groups"]
    groups = all_alerts()["spec"]["groups"]
    for group in groups:
        for rule in group["rules"]:
            del rule["annotations"]["runbook_url"]
    assert groups == shipped


def test_every_alert_reads_metrics_that_exist():
    for rule in rules_of(all_alerts()):
        assert not unknown_metrics(rule["expr"]), (rule["alert"], unknown_metrics(rule["expr"]))


def test_disabled_alerts_are_left_out_and_the_schema_knows_every_alert():
    docs = rendered(MONITORING)
    (rule,) = [doc for doc in docs if doc["kind"] == "PrometheusRule"]
    names = [r["alert"] for r in rules_of(rule)]
    assert "FlotillaFrequentLeaderChanges" not in names
    assert len(names) == len(alert_names()) - 1
    assert rules_of(rule)[0]["annotations"]["runbook_url"].startswith(
        "https://docs.example.com/flotilla/runbooks#flotilla")
    schema = json.loads((CHART / "values.schema.json").read_text())
    disabled = schema["properties"]["monitoring"]["properties"]["prometheusRule"][
        "properties"]["disabledAlerts"]
    assert disabled["items"]["enum"] == alert_names()


def test_promtool_accepts_the_rendered_rules(tmp_path):
    for name, rule in (("all", all_alerts()), ("ci", next(
            doc for doc in rendered(MONITORING) if doc["kind"] == "PrometheusRule"))):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        assert "SUCCESS" in run_promtool("check", "rules", path.name, cwd=tmp_path)


def test_the_alerts_fire_for_what_they_describe_and_only_for_that(tmp_path):
    """promtool test rules on alerts_test.yaml. Annotations are left out: their wording is
    not what the cases are about (promtool would compare them whole)."""
    groups = all_alerts()["spec"]["groups"]
    for group in groups:
        for rule in group["rules"]:
            del rule["annotations"]
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    tested = {case["alertname"] for test in yaml.safe_load(ALERTS_TEST.read_text())["tests"]
              for case in test["alert_rule_test"]}
    assert tested == set(alert_names()), f"alerts without a case: {set(alert_names()) - tested}"
    assert "SUCCESS" in run_promtool("test", "rules", ALERTS_TEST.name, cwd=tmp_path)


# --- the Grafana dashboard --------------------------------------------------------------------


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel's targets."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"]
            for target in panel.get("targets", [])]


def test_the_dashboard_is_a_grafana_dashboard_of_prometheus_panels():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "Flotilla"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "raftcluster"} <= set(variables)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 20
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]


def test_the_dashboard_reads_metrics_that_exist_and_covers_the_key_families():
    queries = dashboard_queries()
    for title, expr in queries:
        assert not unknown_metrics(expr), (title, unknown_metrics(expr))
    read = " ".join(expr for _, expr in queries)
    for family in ("flotilla_server_has_leader", "flotilla_server_leader_changes_seen_total",
                   "flotilla_server_proposals_failed_total", "flotilla_server_proposals_pending",
                   "flotilla_disk_wal_fsync_duration_seconds_bucket",
                   "flotilla_network_peer_round_trip_time_seconds_bucket",
                   "flotilla_http_request_duration_seconds_bucket",
                   "flotilla_archive_lag_entries", "flotilla_server_learner_lag_entries",
                   "flotilla_tls_certificate_expiry_timestamp_seconds",
                   "flotilla_operator_cluster_unavailable_voters",
                   "flotilla_operator_reconcile_duration_seconds_bucket",
                   "process_cpu_seconds_total"):
        assert family in read, f"no panel reads {family}"
    # member panels follow the namespace and RaftCluster pickers
    for title, expr in queries:
        if "flotilla_server_" in expr or "flotilla_disk_" in expr:
            assert '$namespace' in expr and '$raftcluster' in expr, title


def test_promtool_parses_every_dashboard_query(tmp_path):
    """Grafana's variables replaced by what they stand for, each query is a recording rule
    promtool must parse."""
    rules = []
    for number, (_, expr) in enumerate(dashboard_queries()):
        promql = (expr.replace("$__rate_interval", "5m").replace("$namespace", ".*")
                  .replace("$raftcluster", ".*"))
        assert "$" not in promql, expr
        rules.append({"record": f"dashboard:query_{number}", "expr": promql})
    (tmp_path / "dashboard.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert "SUCCESS" in run_promtool("check", "rules", "dashboard.yaml", cwd=tmp_path)


def test_the_dashboard_configmap_carries_the_sidecar_label_and_the_dashboard():
    configmap = only(rendered(MONITORING), "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Databases"}
    assert json.loads(configmap["data"]["flotilla.json"]) == json.loads(DASHBOARD.read_text())
    text = helm("template", "flotilla", str(CHART), "-s", "templates/configmap-dashboard.yaml",
                "--namespace", "ops", "--set", "monitoring.grafanaDashboard.enabled=true",
                "--set", "monitoring.grafanaDashboard.sidecarLabel=dashboards",
                "--set", "monitoring.grafanaDashboard.sidecarLabelValue=flotilla")
    configmap = yaml.safe_load(text)
    assert configmap["metadata"]["labels"]["dashboards"] == "flotilla"
    assert configmap["metadata"]["namespace"] == "ops"
