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
