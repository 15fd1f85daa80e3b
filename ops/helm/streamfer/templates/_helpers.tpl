{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "streamfer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name of every object. */}}
{{- define "streamfer.fullname" -}}
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

{{- define "streamfer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "streamfer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "streamfer.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "streamfer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: worker
{{- end }}

{{- define "streamfer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "streamfer.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Where the existing Secrets are mounted. */}}
{{- define "streamfer.secretsDir" -}}
/var/run/secrets/streamfer
{{- end }}

{{/* The pod's grace period: the worker's drain time plus the time to exit after it. */}}
{{- define "streamfer.terminationGracePeriodSeconds" -}}
{{- add (int .Values.shutdownTimeoutSeconds) (int .Values.terminationGraceExtraSeconds) }}
{{- end }}

{{/* The worker's resources; with gpu.enabled, gpu.count of gpu.resourceName in the
limits (an extended resource is requested as much as it is limited). */}}
{{- define "streamfer.resources" -}}
{{- $resources := deepCopy .Values.resources }}
{{- if .Values.gpu.enabled }}
{{- $limits := get $resources "limits" | default dict }}
{{- $_ := set $limits .Values.gpu.resourceName (int .Values.gpu.count) }}
{{- $_ := set $resources "limits" $limits }}
{{- end }}
{{- toYaml $resources }}
{{- end }}

{{/* The most workers that can own a partition. */}}
{{- define "streamfer.maxReplicas" -}}
{{- min (int .Values.autoscaling.maxReplicas) (int .Values.partitions) }}
{{- end }}

{{/* KEDA's name for a librdkafka sasl.mechanism. */}}
{{- define "streamfer.kedaSasl" -}}
{{- $m := dict "PLAIN" "plaintext" "SCRAM-SHA-256" "scram_sha256" "SCRAM-SHA-512" "scram_sha512" "OAUTHBEARER" "oauthbearer" "GSSAPI" "gssapi" }}
{{- $sasl := .Values.kafka.sasl }}
{{- if not (hasKey $m $sasl.mechanism) }}
{{- fail (printf "kafka.sasl.mechanism %q: expected one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, GSSAPI" $sasl.mechanism) }}
{{- end }}
{{- get $m $sasl.mechanism }}
{{- end }}

{{/* Refuse values that cannot work, with a message naming the value. */}}
{{- define "streamfer.validate" -}}
{{- if not (has .Values.workload (list "Deployment" "StatefulSet")) }}
{{- fail (printf "workload %q: expected Deployment or StatefulSet" .Values.workload) }}
{{- end }}
{{- if lt (int .Values.partitions) 1 }}
{{- fail "partitions must be at least 1" }}
{{- end }}
{{- if not (has .Values.kafka.autoOffsetReset (list "earliest" "latest" "error")) }}
{{- fail (printf "kafka.autoOffsetReset %q: expected earliest, latest or error" .Values.kafka.autoOffsetReset) }}
{{- end }}
{{- if and .Values.autoscaling.enabled (eq .Values.kafka.autoOffsetReset "error") }}
{{- fail "autoscaling needs kafka.autoOffsetReset earliest or latest (KEDA's offsetResetPolicy)" }}
{{- end }}
{{- if and .Values.kafka.sasl.enabled (not .Values.kafka.sasl.existingSecret) }}
{{- fail "kafka.sasl.enabled needs kafka.sasl.existingSecret (a Secret with the SASL user name and password)" }}
{{- end }}
{{- if lt (int .Values.shutdownTimeoutSeconds) 1 }}
{{- fail "shutdownTimeoutSeconds must be at least 1" }}
{{- end }}
{{- end }}
