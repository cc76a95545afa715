{{/* The chart's names and labels. */}}
{{- define "llmroute.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "llmroute.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "llmroute.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "llmroute.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "llmroute.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llmroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "llmroute.labels" -}}
{{ include "llmroute.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The Secret holding the environment's secrets: the chart's, or the operator's own. */}}
{{- define "llmroute.envSecret" -}}
{{- if .Values.secrets.existingSecret -}}
{{- .Values.secrets.existingSecret -}}
{{- else -}}
{{- printf "%s-env" (include "llmroute.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Mistakes refused at install time, each named. */}}
{{- define "llmroute.checks" -}}
{{- if and (contains "LLMROUTE_REDIS_URL" .Values.config) (not (or .Values.redis.url .Values.redis.existingSecret)) -}}
{{- fail "redis.url (or redis.existingSecret) is required: the config's [redis] url_env reads LLMROUTE_REDIS_URL" -}}
{{- end -}}
{{- if and (contains "/etc/llmroute/keys/keys.toml" .Values.config) (not .Values.keysFile) -}}
{{- fail "keysFile is required: the config's keys_file is /etc/llmroute/keys/keys.toml" -}}
{{- end -}}
{{- if lt (int .Values.drain.terminationGracePeriodSeconds) (add (int .Values.drain.preStopSeconds) (int .Values.drain.timeoutSeconds) 10) -}}
{{- fail "drain.terminationGracePeriodSeconds must be at least drain.preStopSeconds + drain.timeoutSeconds + 10 (5 s for the gateway's own shutdown, 5 s of margin)" -}}
{{- end -}}
{{- end -}}
