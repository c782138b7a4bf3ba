{{/* The release's objects are named after it: RELEASE-compensa, or RELEASE when it already says compensa. */}}
{{- define "compensa.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "compensa.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: compensa
app.kubernetes.io/version: {{ include "compensa.tag" . | quote }}
{{- end -}}

{{/* The pods that run the relay: the relay's own, or the application's in sidecar mode. */}}
{{- define "compensa.selectorLabels" -}}
{{- if eq .Values.mode "sidecar" -}}
app.kubernetes.io/name: {{ include "compensa.appName" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- else -}}
app.kubernetes.io/name: compensa-relay
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- end -}}

{{- define "compensa.appName" -}}
{{- required "sidecar mode: set sidecar.application.name" .Values.sidecar.application.name -}}
{{- end -}}

{{- define "compensa.tag" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{- define "compensa.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "compensa.tag" .) -}}
{{- end -}}

{{- define "compensa.secretName" -}}
{{- .Values.secret.existingSecret | default (include "compensa.fullname" .) -}}
{{- end -}}

{{- define "compensa.apiTokensSecretName" -}}
{{- .Values.apiTokens.existingSecret | default (printf "%s-api-tokens" (include "compensa.fullname" .)) -}}
{{- end -}}

{{- define "compensa.validate" -}}
{{- if not (has .Values.mode (list "standalone" "sidecar")) -}}
{{- fail (printf "mode %q: want standalone or sidecar" .Values.mode) -}}
{{- end -}}
{{- if and (not .Values.secret.existingSecret) (not .Values.secret.databaseURL) -}}
{{- fail "set secret.databaseURL (the relay role's DSN) or secret.existingSecret (a Secret with the keys database-url and api-token)" -}}
{{- end -}}
{{- if and (not .Values.secret.existingSecret) (not .Values.secret.apiToken) -}}
{{- fail "set secret.apiToken (openssl rand -hex 32): the monitor listens on the pod's address and needs a token" -}}
{{- end -}}
{{- if and .Values.migrate.enabled (not .Values.migrate.existingSecret) (not .Values.migrate.ownerDatabaseURL) -}}
{{- fail "set migrate.ownerDatabaseURL (the schema owner's DSN) or migrate.existingSecret (key owner-database-url), or migrate.enabled=false" -}}
{{- end -}}
{{- if and .Values.migrate.enabled (not .Values.migrate.grantTo) -}}
{{- fail "set migrate.grantTo: the role of secret.databaseURL, which relay run connects as" -}}
{{- end -}}
{{- if and (eq .Values.mode "sidecar") (not .Values.sidecar.application.containers) -}}
{{- fail "sidecar mode: give the application's containers in sidecar.application.containers" -}}
{{- end -}}
{{- end -}}

{{/* Rolls the pods when the sagas, the sinks or the tokens file change. */}}
{{- define "compensa.checksums" -}}
checksum/sagas: {{ toYaml .Values.sagas | sha256sum }}
checksum/sinks: {{ .Values.sinks | sha256sum }}
checksum/api-tokens: {{ .Values.apiTokens.file | sha256sum }}
{{- end -}}

{{/*
The relay container. Liveness is always on the probe listener. Readiness
only in standalone mode: a pod is ready when all its containers are, so a
relay readiness probe in the application's pod would take the application
out of its Service whenever the database is down or the stream stalls; the
sidecar's health reaches people through the alert rules instead.
*/}}
{{- define "compensa.relayContainer" -}}
{{- $sidecar := eq .Values.mode "sidecar" -}}
- name: relay
  image: {{ include "compensa.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - run
    - --http-addr=0.0.0.0:{{ .Values.ports.monitor }}
    - --probe-addr=0.0.0.0:{{ .Values.ports.probe }}
    - --metrics-addr=0.0.0.0:{{ .Values.ports.metrics }}
    - --workers={{ .Values.relay.workers }}
    - --stop-timeout={{ .Values.relay.stopTimeoutSeconds }}s
    {{- range .Values.relay.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    - name: RELAY_DATABASE_URL
      valueFrom:
        secretKeyRef:
          name: {{ include "compensa.secretName" . }}
          key: database-url
    - name: RELAY_API_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ include "compensa.secretName" . }}
          key: api-token
    - name: RELAY_LOG_LEVEL
      value: {{ .Values.relay.logLevel | quote }}
    {{- if .Values.sagas }}
    - name: RELAY_SAGAS
      value: /etc/compensa/sagas
    {{- end }}
    {{- if .Values.sinks }}
    - name: RELAY_SINKS
      value: /etc/compensa/sinks/sinks.yaml
    {{- end }}
    {{- if or .Values.apiTokens.file .Values.apiTokens.existingSecret }}
    - name: RELAY_API_TOKENS
      value: /etc/compensa/api-tokens/api-tokens.yaml
    {{- end }}
    {{- with .Values.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.envFromSecrets }}
  envFrom:
    {{- range . }}
    - secretRef:
        name: {{ . }}
    {{- end }}
  {{- end }}
  ports:
    - name: monitor
      containerPort: {{ .Values.ports.monitor }}
    - name: probe
      containerPort: {{ .Values.ports.probe }}
    - name: metrics
      containerPort: {{ .Values.ports.metrics }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: probe
    {{- toYaml .Values.probes.liveness | nindent 4 }}
  {{- if not $sidecar }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: probe
    {{- toYaml .Values.probes.readiness | nindent 4 }}
  {{- end }}
  resources:
    {{- toYaml .Values.relay.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  {{- if or .Values.sagas .Values.sinks .Values.apiTokens.file .Values.apiTokens.existingSecret }}
  volumeMounts:
    {{- if .Values.sagas }}
    - name: sagas
      mountPath: /etc/compensa/sagas
      readOnly: true
    {{- end }}
    {{- if .Values.sinks }}
    - name: sinks
      mountPath: /etc/compensa/sinks
      readOnly: true
    {{- end }}
    {{- if or .Values.apiTokens.file .Values.apiTokens.existingSecret }}
    - name: api-tokens
      mountPath: /etc/compensa/api-tokens
      readOnly: true
    {{- end }}
  {{- end }}
{{- end -}}

{{- define "compensa.relayVolumes" -}}
{{- if .Values.sagas }}
- name: sagas
  configMap:
    name: {{ include "compensa.fullname" . }}-sagas
{{- end }}
{{- if .Values.sinks }}
- name: sinks
  configMap:
    name: {{ include "compensa.fullname" . }}-sinks
{{- end }}
{{- if or .Values.apiTokens.file .Values.apiTokens.existingSecret }}
- name: api-tokens
  secret:
    secretName: {{ include "compensa.apiTokensSecretName" . }}
    items:
      - key: api-tokens.yaml
        path: api-tokens.yaml
{{- end }}
{{- end -}}
