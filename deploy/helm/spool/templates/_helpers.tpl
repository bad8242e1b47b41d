{{/* The release's name for its objects. */}}
{{- define "spool.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "spool.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: spool
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: spool
{{- end -}}

{{/* Selector labels of a component: (dict "root" $ "component" "api"). */}}
{{- define "spool.selector" -}}
app.kubernetes.io/name: spool
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "spool.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The Secret both processes read. */}}
{{- define "spool.secretName" -}}
{{- if .Values.existingSecret -}}
{{ .Values.existingSecret }}
{{- else -}}
{{ include "spool.fullname" . }}
{{- end -}}
{{- end -}}

{{/* envFrom of both processes. */}}
{{- define "spool.envFrom" -}}
- configMapRef:
    name: {{ include "spool.fullname" . }}
- secretRef:
    name: {{ include "spool.secretName" . }}
{{- end -}}

{{/* "true" when a migration Job runs, so the processes skip migrating. */}}
{{- define "spool.skipMigrations" -}}
{{ ternary "true" "false" .Values.migrations.job | quote }}
{{- end -}}

{{/* The /tmp volume (the root filesystem is read-only). */}}
{{- define "spool.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end -}}
