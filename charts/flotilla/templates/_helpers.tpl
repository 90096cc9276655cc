{{/*
The chart's name, for labels: `flotilla` unless nameOverride says otherwise.
*/}}
{{- define "flotilla.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's resources, at most 63 characters (a DNS label).
*/}}
{{- define "flotilla.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
chart: name-version, as the helm.sh/chart label wants it.
*/}}
{{- define "flotilla.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels of the operator's pod.

app.kubernetes.io/name is `<name>-operator`, not `<name>`: the members of a RaftCluster are
selected by `app.kubernetes.io/name: flotilla` plus `app.kubernetes.io/instance: <cluster>`, so
a RaftCluster named like this release, in its namespace, would otherwise select (and count in
its PodDisruptionBudget) the operator's pod.
*/}}
{{- define "flotilla.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flotilla.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Labels on every resource of the chart.
*/}}
{{- define "flotilla.labels" -}}
helm.sh/chart: {{ include "flotilla.chart" . }}
{{ include "flotilla.selectorLabels" . }}
app.kubernetes.io/part-of: {{ include "flotilla.name" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Labels of the operator's pod: the chart's, then podLabels, which may not change the chart's own
(the Deployment selects on them, and every RaftCluster's NetworkPolicy admits the operator by
them).
*/}}
{{- define "flotilla.podLabels" -}}
{{- $own := include "flotilla.labels" . | fromYaml }}
{{- range $key, $value := .Values.podLabels }}
{{- if hasKey $own $key }}
{{- fail (printf "podLabels: %q is one of the chart's own labels (the Deployment selects the operator's pod by them); choose another key" $key) }}
{{- end }}
{{- end }}
{{- include "flotilla.labels" . }}
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The operator's metrics port, checked against the liveness port; 0 when metrics are off.
*/}}
{{- define "flotilla.metricsPort" -}}
{{- $port := int .Values.operator.metricsPort }}
{{- if and $port (eq $port (int .Values.operator.livenessPort)) }}
{{- fail (printf "operator.metricsPort and operator.livenessPort are both %d: give the metrics endpoint a port of its own (or 0 to turn it off)" $port) }}
{{- end }}
{{- $port }}
{{- end }}

{{/*
The operator's ServiceAccount: the full name when the chart creates it, else the one given.
*/}}
{{- define "flotilla.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "flotilla.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The operator's image: repository:tag, the tag defaulting to the chart's appVersion.
*/}}
{{- define "flotilla.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The image of members whose RaftCluster does not set spec.image: the operator's own unless
operator.defaultImage is set.
*/}}
{{- define "flotilla.defaultMemberImage" -}}
{{- default (include "flotilla.image" .) .Values.operator.defaultImage }}
{{- end }}

{{/*
What the operator may do in a namespace whose RaftClusters it reconciles, and why: the rules of
the ClusterRole (cluster-wide) or of the Role in each watched namespace (namespaced mode).
Least privilege: named resources and verbs only (no "*"), no update (everything is written
with patch), and no delete where ownerReferences already garbage-collect an object with its
RaftCluster.
*/}}
{{- define "flotilla.rules" -}}
# The objects it reconciles. kopf watches them, and patches them for its finalizer (a final
# snapshot before the members go) and its handler-progress annotations.
- apiGroups: ["flotilla.dev"]
  resources: ["raftclusters"]
  verbs: ["get", "list", "watch", "patch"]
# Members, roles, leader, configuration and conditions are written to the status
# subresource (which also serves `kubectl scale` its status.replicas).
- apiGroups: ["flotilla.dev"]
  resources: ["raftclusters/status"]
  verbs: ["get", "patch"]
# One StatefulSet per RaftCluster: created, resized by the planner one member at a time,
# deleted to replace it when an immutable field of its template has to change.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The headless NAME-peers Service and the client Service NAME. No delete: they go with the
# RaftCluster through their ownerReferences.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
# A PodDisruptionBudget keeping a quorum of voters; its maxUnavailable follows the voters.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Members are observed through their pods, and restarted by deleting a pod (the
# StatefulSet's updateStrategy is OnDelete). The StatefulSet creates pods, never the operator.
# The pods of the restore Job and of the scheduled jobs' Jobs are read (get, list) for their
# exit code and termination message: the result line, or why it failed.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete"]
# A point-in-time restore (spec.bootstrap.restore.index or .time) runs `flotilla pipeline
# snapshot-at` as the Job NAME-restore before any member starts, and watches it finish.
# Delete: only a Job of that name left by an earlier RaftCluster (another owner uid). The
# Jobs of the scheduled compaction and export are listed (by label) for status.archiveJobs.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# spec.archive.compaction and .export run as the CronJobs NAME-compact and NAME-export:
# listed by label, created, patched when the spec changes, deleted (with their Jobs) when
# their block is removed from the spec.
- apiGroups: ["batch"]
  resources: ["cronjobs"]
  verbs: ["list", "create", "patch", "delete"]
# spec.storage.removedVolumePolicy: Delete removes the volume of a member taken out by a
# scale-down, and a retained volume is deleted before its ordinal comes back (never rejoined).
# A larger spec.storage.size is patched into each member's claim (the volume grows in place).
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Each cluster's bootstrap ConfigMap (NAME-bootstrap): how a member with an empty volume
# starts, `new` until the cluster has served and `existing` after, outside the pod template.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Secrets of each cluster, read and written one by name: its admin token (spec.adminTokenSecret,
# or NAME-admin-token, created with 32 random bytes when the spec names none), its CA (NAME-ca,
# or spec.tls.secretName) and its members' certificates (MEMBER-tls, NAME-client-tls), created
# before the pods and patched when they are renewed. No list or watch, so no Secret can be
# enumerated, and no delete: they go with the RaftCluster through their ownerReferences.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "patch"]
# The NetworkPolicy NAME of each cluster (peer port from its own pods only, client port from
# spec.network.clientFrom and the operator); deleted when spec.network.policy is false.
# Watched (by label), like the Services, the budget and the ConfigMap, so one edited or
# deleted by someone else is put back at once.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# kopf reports handler outcomes as Events on the RaftCluster (core API, aggregated by patch).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# ...and through the events.k8s.io API where a client library uses it.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.rbac.certManager }}
# With spec.tls.issuerRef, one cert-manager Certificate per member (and NAME-client-tls):
# created, and patched when the spec changes; they go with the RaftCluster.
- apiGroups: ["cert-manager.io"]
  resources: ["certificates"]
  verbs: ["get", "create", "patch"]
{{- end }}
{{- end }}

{{/*
Namespaced mode: operator.watchNamespaces lists namespaces (no globs), and the chart grants a
Role in each instead of a ClusterRole.
*/}}
{{- define "flotilla.namespaced" -}}
{{- if .Values.operator.watchNamespaces }}true{{- end }}
{{- end }}

{{/*
Labels of the operator's pod as k=v,k=v: the NetworkPolicy of every RaftCluster admits pods
with them from the operator's namespace to the members' client port.
*/}}
{{- define "flotilla.selectorLabelsList" -}}
{{- $labels := list }}
{{- range $line := splitList "\n" (include "flotilla.selectorLabels" .) }}
{{- $pair := splitList ": " $line }}
{{- $labels = append $labels (printf "%s=%s" (index $pair 0) (index $pair 1)) }}
{{- end }}
{{- join "," $labels }}
{{- end }}

{{/*
Flotilla needs Kubernetes 1.29: the RaftCluster CRD validates with CEL rules (GA in 1.29). Not
Chart.yaml's kubeVersion, which helm also checks against the version it assumes when it asks no
cluster (`helm template`, `helm lint`), where it would refuse to render at all: on install and
upgrade .Capabilities is the cluster's own version, and NOTES.txt shows this warning.
*/}}
{{- define "flotilla.kubeVersionWarning" -}}
{{- if semverCompare "<1.29.0-0" .Capabilities.KubeVersion.Version }}
WARNING: this cluster runs Kubernetes {{ .Capabilities.KubeVersion.Version }}, and Flotilla needs 1.29 or
newer: the RaftCluster CRD validates with CEL rules (x-kubernetes-validations), GA in 1.29.
Upgrade the cluster before creating RaftClusters.
{{ end }}
{{- end }}

{{/*
The namespaces whose pods a PodMonitor of members selects: those the operator watches when they
are named, else every namespace.
*/}}
{{- define "flotilla.watchedNamespaceSelector" -}}
{{- $named := true }}
{{- range .Values.operator.watchNamespaces }}
{{- if regexMatch "[*?]" . }}
{{- $named = false }}
{{- end }}
{{- end }}
{{- if and .Values.operator.watchNamespaces $named }}
matchNames:
  {{- toYaml .Values.operator.watchNamespaces | nindent 2 }}
{{- else }}
any: true
{{- end }}
{{- end }}
