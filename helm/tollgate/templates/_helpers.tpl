{{/* The chart's name, or nameOverride. */}}
{{- define "tollgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The full name of the release's objects: the release name alone when it
already contains the chart's name (release `tollgate` gives Service
`tollgate`), else release-chart.
*/}}
{{- define "tollgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tollgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tollgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tollgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tollgate.labels" -}}
helm.sh/chart: {{ include "tollgate.chart" . }}
{{ include "tollgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: rate-limit
{{- end -}}

{{- define "tollgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tollgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tollgate.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The ConfigMap holding the rules: the existing one, or ours. */}}
{{- define "tollgate.rulesConfigMap" -}}
{{- default (printf "%s-rules" (include "tollgate.fullname" .)) .Values.rulesExistingConfigMap -}}
{{- end -}}

{{/* Whether the pod mounts any rules at all. */}}
{{- define "tollgate.hasRules" -}}
{{- if or .Values.rulesExistingConfigMap .Values.rules -}}true{{- end -}}
{{- end -}}

{{/*
Checks of combinations the schema cannot express; each stops the render with
a message naming the values to set. Called from the Deployment.
*/}}
{{- define "tollgate.validate" -}}
{{- $r := .Values.redis -}}
{{- if $r.password -}}
{{- fail "redis.password must not be given inline (it would sit in the Deployment in clear): put it in a Secret and set redis.existingSecret (and redis.existingSecretPasswordKey)" -}}
{{- end -}}
{{- if $r.enabled -}}
{{- if not (has $r.mode (list "standalone" "sentinel" "cluster")) -}}
{{- fail (printf "redis.mode=%v is not valid: expected standalone, sentinel or cluster" $r.mode) -}}
{{- end -}}
{{- if eq $r.mode "standalone" -}}
{{- if ne (len $r.addresses) 1 -}}
{{- fail (printf "redis.mode=standalone needs exactly one redis.addresses entry (host:port), got %d" (len $r.addresses)) -}}
{{- end -}}
{{- else if eq $r.mode "cluster" -}}
{{- if not $r.addresses -}}
{{- fail "redis.mode=cluster needs redis.addresses: one or more cluster nodes (host:port)" -}}
{{- end -}}
{{- else if eq $r.mode "sentinel" -}}
{{- if not $r.addresses -}}
{{- fail "redis.mode=sentinel needs redis.addresses: one or more sentinels (host:port)" -}}
{{- end -}}
{{- $_ := required "redis.mode=sentinel needs redis.sentinelMasterName: the name the sentinels monitor" $r.sentinelMasterName -}}
{{- end -}}
{{- range $r.addresses -}}
{{- if not (regexMatch "^[^:/?&@ ]+:[0-9]{1,5}$" .) -}}
{{- fail (printf "redis.addresses entry %q is not valid: expected host:port" .) -}}
{{- end -}}
{{- end -}}
{{- if $r.tls.enabled -}}
{{- if and $r.tls.useSystemRoots (ne $r.mode "standalone") -}}
{{- fail "redis.tls.useSystemRoots works in standalone mode only: for sentinel and cluster give the CA in redis.tls.existingSecret" -}}
{{- end -}}
{{- if and (not $r.tls.existingSecret) (not $r.tls.useSystemRoots) -}}
{{- fail "redis.tls.enabled needs the CA that signed Redis's certificate (tollgate always verifies it): set redis.tls.existingSecret (key redis.tls.caKey), or redis.tls.useSystemRoots=true for a publicly signed server" -}}
{{- end -}}
{{- if and $r.tls.clientCertificate (not $r.tls.existingSecret) -}}
{{- fail "redis.tls.clientCertificate needs redis.tls.existingSecret holding the certificate and key" -}}
{{- end -}}
{{- end -}}
{{- else if gt (int .Values.replicaCount) 1 -}}
{{- fail "replicaCount > 1 with the embedded store gives each pod its own counters: set redis.enabled=true (or replicaCount=1)" -}}
{{- end -}}
{{- if and (not $r.enabled) .Values.autoscaling.enabled -}}
{{- fail "autoscaling.enabled needs redis.enabled=true: with the embedded store each pod would count on its own" -}}
{{- end -}}
{{- if and .Values.grpcTls.enabled (not .Values.grpcTls.existingSecret) -}}
{{- fail "grpcTls.enabled needs grpcTls.existingSecret: a kubernetes.io/tls Secret (tls.crt, tls.key; ca.crt for grpcTls.clientAuth)" -}}
{{- end -}}
{{- if and .Values.grpcTls.clientAuth (not .Values.grpcTls.enabled) -}}
{{- fail "grpcTls.clientAuth needs grpcTls.enabled=true" -}}
{{- end -}}
{{- if and .Values.rulesExistingConfigMap .Values.rules -}}
{{- fail "give either rules or rulesExistingConfigMap, not both" -}}
{{- end -}}
{{- $t := .Values.tollgate -}}
{{- $needed := add (div (add $t.shutdownDrainMs $t.shutdownGraceMs 999) 1000) 1 -}}
{{- if and (not (kindIs "invalid" .Values.terminationGracePeriodSeconds)) (lt (int .Values.terminationGracePeriodSeconds) (int $needed)) -}}
{{- fail (printf "terminationGracePeriodSeconds=%v must exceed tollgate.shutdownDrainMs + shutdownGraceMs (%d ms): at least %d" .Values.terminationGracePeriodSeconds (add $t.shutdownDrainMs $t.shutdownGraceMs) $needed) -}}
{{- end -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: given, or drain + grace rounded up + 5. */}}
{{- define "tollgate.terminationGrace" -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- $t := .Values.tollgate -}}
{{- add (div (add $t.shutdownDrainMs $t.shutdownGraceMs 999) 1000) 5 -}}
{{- else -}}
{{- .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}

{{/* The store setting: memory, or the Redis URL of the mode. */}}
{{- define "tollgate.store" -}}
{{- $r := .Values.redis -}}
{{- if not $r.enabled -}}
memory
{{- else if eq $r.mode "standalone" -}}
{{- printf "%s://%s" (ternary "rediss" "redis" $r.tls.enabled) (first $r.addresses) -}}
{{- else if eq $r.mode "cluster" -}}
{{- $nodes := list -}}
{{- range rest $r.addresses -}}{{- $nodes = append $nodes (printf "node=%s" .) -}}{{- end -}}
{{- printf "redis-cluster://%s" (first $r.addresses) -}}{{- if $nodes -}}?{{ join "&" $nodes }}{{- end -}}
{{- else -}}
{{- $q := list (printf "sentinelServiceName=%s" (urlquery $r.sentinelMasterName)) -}}
{{- range rest $r.addresses -}}{{- $q = append $q (printf "node=%s" .) -}}{{- end -}}
{{- printf "redis-sentinel://%s?%s" (first $r.addresses) (join "&" $q) -}}
{{- end -}}
{{- end -}}

{{/* A name a setting's variable: redis.pool_size -> TOLLGATE_REDIS__POOL_SIZE. */}}
{{- define "tollgate.envName" -}}
{{- printf "TOLLGATE_%s" (. | replace "." "__" | upper) -}}
{{- end -}}

{{/*
A value as a setting's string. Helm reads numbers in values as floats, and
prints 1000000 as 1e+06: whole numbers are printed as integers.
*/}}
{{- define "tollgate.str" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}
