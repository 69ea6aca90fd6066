{{/* The chart's name (app.kubernetes.io/name: the job the alerts select). */}}
{{- define "proxyhealth.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name: the release's, unless it does not contain the chart's name. */}}
{{- define "proxyhealth.fullname" -}}
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

{{- define "proxyhealth.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "proxyhealth.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{/* The namespace of an optional object with its own namespace value: (list $ .namespace). */}}
{{- define "proxyhealth.namespaceOf" -}}
{{- $ := index . 0 }}
{{- default (include "proxyhealth.namespace" $) (index . 1) }}
{{- end }}

{{- define "proxyhealth.selectorLabels" -}}
app.kubernetes.io/name: {{ include "proxyhealth.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "proxyhealth.labels" -}}
{{ include "proxyhealth.componentLabels" (list . "metrics") }}
{{- end }}

{{/* The labels of an object of one component: (list $ "node-conditions"). */}}
{{- define "proxyhealth.componentLabels" -}}
{{- $ := index . 0 }}
helm.sh/chart: {{ include "proxyhealth.chart" $ }}
{{ include "proxyhealth.selectorLabels" $ }}
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $.Release.Service }}
app.kubernetes.io/component: {{ index . 1 }}
{{- with $.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "proxyhealth.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "proxyhealth.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag[@digest]; the tag defaults to v<appVersion>. */}}
{{- define "proxyhealth.image" -}}
{{- $tag := default (printf "v%s" .Chart.AppVersion) .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "proxyhealth.imagePullSecrets" -}}
{{- range . }}
{{- if kindIs "map" . }}
- {{ toYaml . | trim }}
{{- else }}
- name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* The relabeling every scrape gets: the pod's node as label node on every series. */}}
{{- define "proxyhealth.relabelings" -}}
- action: replace
  sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
{{- with . }}
{{ toYaml . }}
{{- end }}
{{- end }}
