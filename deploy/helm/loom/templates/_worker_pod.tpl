{{/* The pod template of a worker: one tensor-parallel group (StatefulSet) or one pod of
     a group (LeaderWorkerSet). Called with (dict "root" $ "lws" BOOL). */}}
{{- define "loom.worker.podTemplate" -}}
{{- $ := .root -}}
{{- $lws := .lws -}}
{{- $w := $.Values.worker -}}
{{- $c := $.Values.coordinator -}}
{{- $ranks := int (include "loom.worker.ranksPerPod" $) -}}
{{- $name := include "loom.worker.name" $ -}}
{{- $drain := 0 -}}
{{- with (index $w.flags "drain-timeout-s") }}{{ $drain = int . }}{{ end -}}
{{- $grace := $w.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $grace -}}
{{- $grace = add (max $drain $c.drainTimeoutSeconds) $c.preStopSleepSeconds $c.terminationGraceExtraSeconds -}}
{{- end -}}
{{- $selector := merge (fromYaml (include "loom.selectorLabels" $)) (dict "app.kubernetes.io/component" "worker") -}}
{{- /* Disaggregated serving: the `prefill` pool's pods prefill, `worker`'s decode. */ -}}
{{- $role := "" -}}
{{- if $.Values.prefill.enabled }}{{ $role = default "decode" $w.role }}{{ end -}}
metadata:
  labels:
    {{- toYaml $selector | nindent 4 }}
    {{- with $role }}
    loom.dev/role: {{ . }}
    {{- end }}
    {{- with $w.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") $ | sha256sum }}
    {{- with $w.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "loom.serviceAccountName" $ }}
  automountServiceAccountToken: {{ $.Values.serviceAccount.automountToken }}
  {{- with $w.runtimeClassName }}
  runtimeClassName: {{ . }}
  {{- end }}
  {{- with $w.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $.Values.podSecurityContext | nindent 4 }}
  # Covers the worker's drain on scale-in (flags.drain-timeout-s).
  terminationGracePeriodSeconds: {{ $grace }}
  {{- with (include "loom.modelInitContainers" $ | trim) }}
  initContainers:
    {{- . | nindent 4 }}
  {{- end }}
  containers:
    - name: worker
      image: {{ include "loom.worker.image" $ }}
      imagePullPolicy: {{ $.Values.image.pullPolicy }}
      # The pod's ranks as processes (loom.worker.launcher in _helpers.tpl); what follows
      # the script is the loom-worker command line every rank shares.
      command: ["/bin/bash", "-c"]
      args:
        - {{ include "loom.worker.launcher" $ | quote }}
        - launch-ranks
        - loom-worker
        - --model
        - $(LOOM_MODEL_PATH)
        - --coordinator
        - {{ printf "%s:%v" (include "loom.coordinator.internalName" $) $c.grpcPort }}
        # The replica id: the pod's name (StatefulSet) or its group leader's.
        - --replica-id
        - $(LOOM_REPLICA_ID)
        - --cluster-secret-file
        - /etc/loom/cluster-secret/{{ $.Values.clusterSecret.secretKey }}
        - --world-size
        - {{ include "loom.worker.ranksPerReplica" $ | quote }}
        {{- if gt (int (default 1 $w.pipelineParallelSize)) 1 }}
        - --pipeline-parallel-size
        - {{ $w.pipelineParallelSize | quote }}
        {{- end }}
        {{- include "loom.flagArgs" $w.flags | trim | nindent 8 }}
        {{- with $role }}
        - --role
        - {{ . }}
        {{- end }}
      envFrom:
        - configMapRef:
            name: {{ include "loom.fullname" $ }}-worker{{ if eq $role "prefill" }}-prefill{{ end }}
      env:
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- if $lws }}
        - name: POD_IP
          valueFrom:
            fieldRef:
              fieldPath: status.podIP
        - name: LOOM_GROUP_INDEX
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['leaderworkerset.sigs.k8s.io/group-index']
        - name: LOOM_POD_INDEX
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']
        # The leader's name, the same for every pod of the group.
        - name: LOOM_REPLICA_ID
          value: {{ printf "%s-$(LOOM_GROUP_INDEX)" $name | quote }}
        - name: LOOM_ADVERTISE_HOST
          value: $(POD_IP)
        # Pods of one group start under one group key and template revision.
        - name: LOOM_GROUP_KEY
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['leaderworkerset.sigs.k8s.io/group-key']
        - name: LOOM_TEMPLATE_REVISION
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['leaderworkerset.sigs.k8s.io/template-revision-hash']
        - name: LOOM_RENDEZVOUS_ID
          value: $(LOOM_GROUP_KEY)-$(LOOM_TEMPLATE_REVISION)
        {{- else }}
        - name: LOOM_POD_INDEX
          value: "0"
        - name: LOOM_REPLICA_ID
          value: $(POD_NAME)
        # Its stable DNS name under the headless Service.
        - name: LOOM_ADVERTISE_HOST
          value: {{ printf "$(POD_NAME).%s.$(POD_NAMESPACE).svc.%s" $name $.Values.clusterDomain | quote }}
        {{- end }}
        - name: LOOM_RANKS_PER_POD
          value: {{ $ranks | quote }}
        {{- if $w.gpu.enabled }}
        # One GPU per rank of the pod (the launcher passes --gpu-index).
        - name: LOOM_GPUS_PER_POD
          value: {{ $ranks | quote }}
        {{- end }}
        - name: LOOM_WORKER_PORT
          value: {{ $w.port | quote }}
        {{- if $w.metrics.enabled }}
        - name: LOOM_METRICS_PORT
          value: {{ $w.metrics.port | quote }}
        {{- end }}
        {{- with $w.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        {{- range $i := until $ranks }}
        - name: {{ ternary "grpc" (printf "grpc-%d" $i) (eq $i 0) }}
          containerPort: {{ add $w.port $i }}
          protocol: TCP
        {{- end }}
        {{- if $w.metrics.enabled }}
        {{- range $i := until $ranks }}
        - name: {{ ternary "metrics" (printf "metrics-%d" $i) (eq $i 0) }}
          containerPort: {{ add $w.metrics.port $i }}
          protocol: TCP
        {{- end }}
        {{- end }}
      # grpc.health.v1 on the first rank's port; it listens once the weights are loaded
      # (and, with several ranks, once they all met).
      startupProbe:
        grpc:
          port: {{ $w.port }}
        periodSeconds: {{ $w.probes.startup.periodSeconds }}
        failureThreshold: {{ $w.probes.startup.failureThreshold }}
      readinessProbe:
        grpc:
          port: {{ $w.port }}
        periodSeconds: {{ $w.probes.readiness.periodSeconds }}
        failureThreshold: {{ $w.probes.readiness.failureThreshold }}
      livenessProbe:
        grpc:
          port: {{ $w.port }}
        periodSeconds: {{ $w.probes.liveness.periodSeconds }}
        failureThreshold: {{ $w.probes.liveness.failureThreshold }}
        timeoutSeconds: {{ $w.probes.liveness.timeoutSeconds }}
      securityContext:
        {{- toYaml $.Values.securityContext | nindent 8 }}
      resources:
        {{- $resources := deepCopy (default dict $w.resources) }}
        {{- if $w.gpu.enabled }}
        {{- $limits := default dict $resources.limits }}
        {{- $requests := default dict $resources.requests }}
        {{- $_ := set $limits $w.gpu.resourceName $ranks }}
        {{- $_ := set $requests $w.gpu.resourceName $ranks }}
        {{- $_ := set $resources "limits" $limits }}
        {{- $_ := set $resources "requests" $requests }}
        {{- end }}
        {{- toYaml $resources | nindent 8 }}
      volumeMounts:
        {{- include "loom.modelMount" $ | nindent 8 }}
        - name: tmp
          mountPath: /tmp
        - name: cluster-secret
          mountPath: /etc/loom/cluster-secret
          readOnly: true
        {{- if $w.shm.enabled }}
        - name: dshm
          mountPath: /dev/shm
        {{- end }}
        {{- with $w.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    {{- include "loom.modelVolume" $ | nindent 4 }}
    - name: tmp
      emptyDir: {}
    - name: cluster-secret
      secret:
        secretName: {{ include "loom.clusterSecret" $ }}
    {{- if $w.shm.enabled }}
    # The ranks of the pod share it (NCCL's and gloo's shared-memory transport).
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $w.shm.sizeLimit }}
    {{- end }}
    {{- with $w.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $w.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $tolerations := concat (default list $w.tolerations) (ternary $w.gpu.tolerations list $w.gpu.enabled) }}
  {{- with $tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- include "loom.worker.placement" (list $ $selector) | nindent 2 }}
{{- end }}
