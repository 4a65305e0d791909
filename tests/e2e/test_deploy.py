"""Validates everything under deploy/: parsing, the compose stack, the Kubernetes manifests, the
Dockerfile's pins, the Prometheus config and rules (promtool where installed), the generated
Grafana dashboard, and that every metric those files query is in docs/metrics.md."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.deploy_metrics import (
    DEPLOY_DIR,
    PROMETHEUS_BUILTINS,
    REPO_ROOT,
    base_metric_name,
    contract_metrics,
    deploy_exprs,
    metric_names_in_promql,
    metric_names_used_by_deploy,
)

COMPOSE = DEPLOY_DIR / "compose" / "compose.yaml"
K8S = DEPLOY_DIR / "k8s"
PROM = DEPLOY_DIR / "prometheus"
RULES = PROM / "rules" / "sparrow.rules.yml"
DOCKERFILE = DEPLOY_DIR / "docker" / "Dockerfile"
COMPOSE_ENV = {"SPARROW_MODEL_DIR": "/tmp/model", "SPARROW_DEFAULT_SCHEDULE": "qwen3-8b-0.86", "SPARROW_API_KEY": "test-key"}
API_PORT, ROUTER_METRICS_PORT = 30000, 29000


def _load_module(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kwargs)


# --------------------------------------------------------------------------- every file parses

DEPLOY_FILES = sorted(p for p in DEPLOY_DIR.rglob("*") if p.suffix in (".yml", ".yaml", ".json"))


def test_deploy_tree_has_the_files_the_docs_name():
    for rel in ("docker/Dockerfile", "docker/router.Dockerfile", "docker/constraints.txt", "compose/compose.yaml",
                "prometheus/prometheus.yml", "prometheus/rules/sparrow.rules.yml", "grafana/dashboards/sparrow.json",
                "grafana/provisioning/datasources/prometheus.yaml", "grafana/provisioning/dashboards/sparrow.yaml",
                "k8s/kustomization.yaml"):
        assert (DEPLOY_DIR / rel).is_file(), rel


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=lambda p: str(p.relative_to(DEPLOY_DIR)))
def test_every_yaml_and_json_file_parses(path: Path):
    if path.suffix == ".json":
        assert isinstance(json.loads(path.read_text()), dict)
    else:
        assert _yaml_docs(path), f"{path} holds no YAML document"


# --------------------------------------------------------------------------- metrics contract

def test_metric_name_extraction():
    expr = ('histogram_quantile(0.95, sum by (instance, le) (rate(a_bucket{x=~"$instance", y="b_c"}[$__rate_interval])))'
            ' > 1e3 and on (instance) b_total offset 5m unless ignoring(z) max without (q) (c) == bool 0')
    assert metric_names_in_promql(expr) == {"a_bucket", "b_total", "c"}
    assert metric_names_in_promql('label_values(d_total{instance=~"$instance"}, schedule)') == {"d_total"}
    contract = {"h": "histogram", "g_count": "gauge"}
    assert base_metric_name("h_bucket", contract) == "h" and base_metric_name("g_count", contract) == "g_count"


def test_every_metric_queried_by_deploy_is_in_the_contract():
    contract = contract_metrics()
    assert len(contract) >= 16
    for path, exprs in deploy_exprs().items():
        assert exprs, f"{path} has no queries"
        for expr in exprs:
            for series in metric_names_in_promql(expr) - PROMETHEUS_BUILTINS:
                assert base_metric_name(series, contract) in contract, f"{path}: {series!r} is not in docs/metrics.md ({expr})"


def test_histogram_series_are_queried_with_a_histogram_suffix():
    contract = contract_metrics()
    for path, exprs in deploy_exprs().items():
        for expr in exprs:
            for series in metric_names_in_promql(expr):
                if contract.get(series) == "histogram":
                    pytest.fail(f"{path}: histogram {series} queried without _bucket/_sum/_count: {expr}")


def test_dashboard_and_rules_cover_the_tail_metrics():
    used = metric_names_used_by_deploy()
    assert {"sparrow_acceptance", "sparrow_acceptance_p5", "sparrow_acceptance_threshold",
            "sparrow_tail_violations_total", "sparrow_kv_budget_tokens", "sparrow_generated_tokens_total",
            "sparrow_adapter_inflight_requests", "sparrow_time_to_first_token_seconds",
            "sparrow_request_latency_seconds"} <= used
    assert all(n.startswith("sparrow_") for n in used)


# --------------------------------------------------------------------------- Grafana

def _dashboard() -> dict:
    return json.loads((DEPLOY_DIR / "grafana" / "dashboards" / "sparrow.json").read_text())


def test_dashboard_is_the_generator_output():
    builder = _load_module(DEPLOY_DIR / "grafana" / "build_dashboard.py")
    committed = (DEPLOY_DIR / "grafana" / "dashboards" / "sparrow.json").read_text()
    assert committed == builder.render(), "run: python deploy/grafana/build_dashboard.py"


def test_dashboard_panels_and_variables():
    dashboard = _dashboard()
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in panels}
    for wanted in ("p5 acceptance per length bin vs threshold", "Per-token acceptance (histogram)",
                   "KV budget per decode step", "Generated tokens/s by schedule", "Tail violations",
                   "Adapter in use (in-flight requests)", "Request latency", "Time to first token"):
        assert wanted in titles, wanted
    kinds = {p["title"]: p["type"] for p in panels}
    assert kinds["Per-token acceptance (histogram)"] == "heatmap"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"datasource", "instance", "schedule"} <= set(variables)
    assert all(variables[n]["multi"] and variables[n]["includeAll"] for n in ("instance", "schedule"))
    p5 = next(p for p in panels if p["title"] == "p5 acceptance per length bin vs threshold")
    exprs = [t["expr"] for t in p5["targets"]]
    assert any("sparrow_acceptance_p5" in e and "length_bin" in e for e in exprs)
    assert any("sparrow_acceptance_threshold" in e for e in exprs)
    for panel in panels:
        for t in panel.get("targets", []):
            if "sparrow_" in t["expr"]:
                assert '$instance' in t["expr"], f"{panel['title']}: not filtered by $instance"
    grid = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels]
    assert len(grid) == len(set(grid)), "two panels at one grid position"
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in panels)


def test_grafana_provisioning_points_at_the_dashboards_and_prometheus():
    datasources = yaml.safe_load((DEPLOY_DIR / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    (ds,) = datasources["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((DEPLOY_DIR / "grafana/provisioning/dashboards/sparrow.yaml").read_text())
    path = providers["providers"][0]["options"]["path"]
    grafana = _compose()["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    assert mounts[path] == "../grafana/dashboards"
    assert mounts["/etc/grafana/provisioning/datasources"] == "../grafana/provisioning/datasources"


# --------------------------------------------------------------------------- Prometheus

def _rules() -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}


def test_tail_alert_compares_p5_with_the_threshold_for_10_minutes():
    rule = _rules()["SparrowTailAcceptanceBelowThreshold"]
    expr = " ".join(rule["expr"].split())
    assert re.search(r"sparrow_acceptance_p5 < on \(instance, schedule\) group_left sparrow_acceptance_threshold", expr)
    assert rule["for"] == "10m" and rule["labels"]["severity"] == "critical"


def test_scrape_config_targets_match_the_compose_services():
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    servers = {t for sc in jobs["sparrow"]["static_configs"] for t in sc["targets"]}
    assert servers == {f"{name}:{API_PORT}" for name in _compose_server_names()}
    assert {t for sc in jobs["sparrow-router"]["static_configs"] for t in sc["targets"]} == {f"router:{ROUTER_METRICS_PORT}"}
    assert jobs["sparrow"]["metrics_path"] == "/metrics"


PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not on PATH (Debian: apt-get install prometheus)")


@needs_promtool
def test_promtool_check_rules():
    result = _run([PROMTOOL, "check", "rules", str(RULES)])
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_rule_unit_tests():
    result = _run([PROMTOOL, "test", "rules", str(PROM / "rules" / "sparrow.rules.test.yml")])
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_check_config(tmp_path: Path):
    # rule_files names the container path; point it at the repo's rules for the check
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    config["rule_files"] = [str(RULES)]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = _run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")])
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_k8s_prometheusrule_rules_pass_promtool(tmp_path: Path):
    (rule,) = _yaml_docs(K8S / "prometheusrule.yaml")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = _run([PROMTOOL, "check", "rules", str(tmp_path / "rules.yml")])
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- compose

def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _compose_server_names() -> list[str]:
    return sorted(n for n in _compose()["services"] if n.startswith("sparrow-"))


def _flag_values(args: list[str], flag: str) -> list[str]:
    """Values after ``flag`` up to the next ``--flag``."""
    if flag not in args:
        return []
    rest = args[args.index(flag) + 1:]
    values = []
    for arg in rest:
        if arg.startswith("--"):
            break
        values.append(arg)
    return values


def test_compose_structure():
    compose = _compose()
    services = compose["services"]
    assert {"router", "prometheus", "grafana"} <= set(services)
    servers = _compose_server_names()
    assert len(servers) >= 2
    for name in servers:
        server = services[name]
        assert server["build"]["dockerfile"] == "deploy/docker/Dockerfile"
        assert (COMPOSE.parent / server["build"]["context"] / server["build"]["dockerfile"]).resolve() == DOCKERFILE
        (device,) = server["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"] and len(device["device_ids"]) == 1
        assert "/health" in " ".join(server["healthcheck"]["test"])
        assert any(v.endswith(":/models/model:ro") for v in server["volumes"])
        assert any(v.endswith(":/var/lib/sparrow") for v in server["volumes"])
        assert _flag_values(server["command"], "--port") == [str(API_PORT)]
    gpus = [services[n]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"][0] for n in servers]
    assert len(set(gpus)) == len(gpus), "two servers share a GPU"
    router = services["router"]
    assert _flag_values(router["command"], "--worker-urls") == [f"http://{n}:{API_PORT}" for n in servers]
    assert _flag_values(router["command"], "--prometheus-port") == [str(ROUTER_METRICS_PORT)]
    assert set(router["depends_on"]) == set(servers)
    published = {name: [str(p).split(":")[-1] for p in service.get("ports", [])] for name, service in services.items()}
    assert published["router"] == [str(API_PORT)] and published["grafana"] == ["3000"] and published["prometheus"] == ["9090"]
    assert all(not published[n] for n in servers), "servers are reached through the router, not published"
    assert all(str(API_PORT) in [str(p) for p in services[n]["expose"]] for n in servers)
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        for dependency in service.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown {dependency}"
    for volume_owner in services.values():
        for volume in volume_owner.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith(".."):
                assert (COMPOSE.parent / source).exists(), source
            elif not source.startswith("$"):
                assert source in compose["volumes"], source


def _compose_cli() -> list[str] | None:
    """``docker compose`` (v2 plugin), else the v1 ``docker-compose`` (Debian's package), which
    validates against the Compose specification's schema too."""
    docker = shutil.which("docker")
    if docker and _run([docker, "compose", "version"]).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_docker_compose_config():
    cli = _compose_cli()
    if cli is None:
        pytest.skip("neither `docker compose` nor `docker-compose` here; test_compose_structure checks the file")
    result = _run([*cli, "-f", str(COMPOSE), "config", "--quiet"], env={**os.environ, **COMPOSE_ENV})
    assert result.returncode == 0, result.stderr
    for unset in COMPOSE_ENV:  # both are required, and the error says which is missing
        env = {k: v for k, v in {**os.environ, **COMPOSE_ENV}.items() if k != unset}
        missing = _run([*cli, "-f", str(COMPOSE), "config", "--quiet"], env=env)
        assert missing.returncode != 0 and unset in missing.stderr


# --------------------------------------------------------------------------- router flags

def _router_help() -> str:
    pytest.importorskip("sglang_router", reason="sglang-router is not installed")
    result = _run([sys.executable, "-m", "sglang_router.launch_router", "--help"])
    assert result.returncode == 0, result.stderr
    return result.stdout


def _k8s_router_args() -> list[str]:
    docs = _yaml_docs(K8S / "router.yaml")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_router_flags_exist_in_the_installed_router():
    known = set(re.findall(r"--[a-z][a-z0-9-]*", _router_help()))
    for where, args in (("compose", _compose()["services"]["router"]["command"]), ("k8s", _k8s_router_args())):
        for flag in (a for a in args if a.startswith("--")):
            assert flag in known, f"{where}: sglang-router has no flag {flag}"


# --------------------------------------------------------------------------- Kubernetes

def _k8s_docs() -> list[dict]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = [d for name in kustomization["resources"] for d in _yaml_docs(K8S / name)]
    assert {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"} == set(kustomization["resources"])
    return docs


def _by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_k8s_manifests_have_the_required_fields():
    for doc in _k8s_docs():
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
        assert doc["metadata"].get("name"), doc
        if doc["kind"] not in ("Namespace", "ServiceAccount", "Role", "RoleBinding"):
            assert "spec" in doc, doc["kind"]


def test_k8s_server_deployment():
    docs = _k8s_docs()
    server = _by_kind(docs, "Deployment")["sparrow-server"]
    pod = server["spec"]["template"]
    assert server["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health", probe
        assert container[probe]["httpGet"]["port"] in ("http", API_PORT)
    assert _flag_values(container["args"], "--port") == [str(API_PORT)]
    assert _flag_values(container["args"], "--model") == ["/models/model"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["model"]["mountPath"] == "/models/model" and mounts["model"]["readOnly"]
    assert _flag_values(container["args"], "--state-dir") == [mounts["state"]["mountPath"]]
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    assert set(mounts) <= volumes
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == str(API_PORT)
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    service = _by_kind(docs, "Service")["sparrow-server"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


def test_k8s_router_discovers_the_server_pods():
    docs = _k8s_docs()
    router = _by_kind(docs, "Deployment")["sparrow-router"]
    args = _k8s_router_args()
    server_labels = _by_kind(docs, "Deployment")["sparrow-server"]["spec"]["template"]["metadata"]["labels"]
    selector = dict(s.split("=", 1) for s in _flag_values(args, "--selector"))
    assert selector.items() <= server_labels.items()
    assert _flag_values(args, "--service-discovery-port") == [str(API_PORT)]
    account = router["spec"]["template"]["spec"]["serviceAccountName"]
    binding = _by_kind(docs, "RoleBinding")["sparrow-router-pod-discovery"]
    assert binding["subjects"][0]["name"] == account
    role = _by_kind(docs, "Role")[binding["roleRef"]["name"]]
    assert {"list", "watch"} <= set(role["rules"][0]["verbs"]) and "pods" in role["rules"][0]["resources"]
    service = _by_kind(docs, "Service")["sparrow-router"]
    assert {p["port"] for p in service["spec"]["ports"]} == {API_PORT, ROUTER_METRICS_PORT}


def test_k8s_podmonitor_selects_both_deployments():
    docs = _k8s_docs()
    (monitor,) = _by_kind(docs, "PodMonitor").values()
    selector = monitor["spec"]["selector"]["matchLabels"]
    for deployment in _by_kind(docs, "Deployment").values():
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    ports = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    container_ports = {p["name"] for d in _by_kind(docs, "Deployment").values()
                       for c in d["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert ports <= container_ports


def test_k8s_prometheusrule_is_the_rules_file():
    (rule,) = _yaml_docs(K8S / "prometheusrule.yaml")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    builder = _load_module(K8S / "build_prometheusrule.py")
    assert (K8S / "prometheusrule.yaml").read_text() == builder.render(), "run: python deploy/k8s/build_prometheusrule.py"


def test_k8s_schemas():
    """Against the Kubernetes OpenAPI schemas (kubernetes-validate bundles them; offline)."""
    validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    for doc in _k8s_docs():
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no bundled schema; the structural tests above cover it
        validate.validate(doc, "1.32.0", strict=True)


def test_kustomize_build():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not on PATH")
    result = _run([kubectl, "kustomize", str(K8S)])
    assert result.returncode == 0, result.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(result.stdout) if d)
    assert kinds.count("Deployment") == 2 and "PodMonitor" in kinds
    assert all(d["metadata"].get("namespace") == "sparrow" for d in yaml.safe_load_all(result.stdout)
               if d and d["kind"] != "Namespace")


# --------------------------------------------------------------------------- Dockerfile

def _dockerfile() -> str:
    return DOCKERFILE.read_text()


def test_dockerfile_entrypoint_user_healthcheck():
    text = _dockerfile()
    assert 'ENTRYPOINT ["sparrow-server", "serve", "--engine", "sglang"]' in text
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:13\.\d+\.\d+-devel-ubuntu24\.04$", text, re.M)
    assert re.search(r"^HEALTHCHECK .*\n.*127\.0\.0\.1:30000/health", text, re.M)
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert "HF_HUB_OFFLINE=1" in text and "python3.12" in text


def _dockerfile_env() -> dict[str, str]:
    """The image's ENV settings (``ENV A=1 \\`` continued lines), the last of each name."""
    env: dict[str, str] = {}
    for block in re.findall(r"^ENV ((?:.*\\\n)*.*)$", _dockerfile(), re.M):
        env.update(re.findall(r"([A-Z_][A-Z0-9_]*)=(\S+)", block))
    return env


def test_kernel_caches_live_on_the_servers_cache_volume():
    """Triton's cache (the selection kernels a first graph capture compiles, about a minute) lies under the
    directory every compose server and the k8s pod mount as their cache, beside FlashInfer's (~/.cache)."""
    env = _dockerfile_env()
    home = "/home/sparrow"
    cache = f"{home}/.cache"
    assert env["TRITON_CACHE_DIR"].startswith(cache + "/") and env["HF_HOME"].startswith(cache + "/")
    compose = _compose()
    for name in _compose_server_names():
        targets = {v.split(":")[1]: v.split(":")[0] for v in compose["services"][name]["volumes"]}
        assert targets.get(cache) == f"{name}-cache" and f"{name}-cache" in compose["volumes"], name
    server = _by_kind(_k8s_docs(), "Deployment")["sparrow-server"]
    (container,) = server["spec"]["template"]["spec"]["containers"]
    assert {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["cache"] == cache


def test_dockerfile_pins_agree_with_constraints_and_sglang():
    text = _dockerfile()
    constraints = dict(line.split("==") for line in (DEPLOY_DIR / "docker" / "constraints.txt").read_text().splitlines()
                       if line and not line.startswith("#"))
    assert constraints["sglang"] == "0.5.17" and constraints["flashinfer-python"] == "0.6.15.post1"
    assert constraints["torch"].startswith("2.11.")
    for name, pinned in re.findall(r"([a-z][a-z0-9-]*)(?:\[[a-z0-9]+\])?==([0-9][0-9a-z.]*[0-9a-z])", text):
        if name in constraints:
            assert constraints[name] == pinned, f"Dockerfile pins {name}=={pinned}, constraints.txt {constraints[name]}"


def test_plugin_entry_point_is_declared():
    tomllib = pytest.importorskip("tomllib", reason="Python < 3.11")

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert "sparrow" in project["entry-points"]["sglang.srt.plugins"]
    assert project["scripts"]["sparrow-server"] == "sparrow_server.cli:main"


# --------------------------------------------------------------------------- queries against a real Prometheus

PROMETHEUS = shutil.which("prometheus")
CONTRACT_ROW = re.compile(r"^\|\s*`(sparrow_[a-z0-9_]+)`\s*\|\s*(counter|gauge|histogram)\s*\|([^|]*)\|")
GRAFANA_VARS = {"$__rate_interval": "5s", "$__range": "1m", "$instance": ".*", "$schedule": ".*"}


def _contract_exporter():
    """A registry with every sparrow metric of the contract (its labels), with two schedules'
    worth of samples, as a server would export them."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    registry = CollectorRegistry()
    rows = [CONTRACT_ROW.match(line.strip()) for line in (REPO_ROOT / "docs" / "metrics.md").read_text().splitlines()]
    kinds = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}
    values = {"schedule": "qwen3-8b-0.86", "length_bin": "3", "endpoint": "generate", "status": "ok", "adapter": "",
              "weight_version": "v1", "reason": "queue_full"}
    metrics = []
    for row in filter(None, rows):
        name, kind, label_text = row.groups()
        labels = re.findall(r"`([a-z_]+)`", label_text)
        metric_name = name.removesuffix("_total") if kind == "counter" else name
        metric = kinds[kind](metric_name, name, labels, registry=registry)
        metrics.append((kind, metric.labels(*(values[l] for l in labels)) if labels else metric))
    return registry, metrics


def _feed(metrics) -> None:
    import random

    for kind, metric in metrics:
        if kind == "counter":
            metric.inc(random.randint(1, 5))
        elif kind == "gauge":
            metric.set(1)
        else:
            metric.observe(random.random())


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not on PATH (Debian: apt-get install prometheus)")
def test_dashboard_queries_return_data_from_contract_metrics(tmp_path: Path):
    """Every dashboard query parses in a real Prometheus, and each sparrow query returns series
    when the contract's metrics (with the contract's labels) are scraped."""
    import threading
    import time

    import httpx
    from prometheus_client import start_http_server

    from helpers.fleet_util import LOOPBACK, free_port, wait_until

    registry, metrics = _contract_exporter()
    exporter_port, prom_port = free_port(), free_port()
    server, thread = start_http_server(exporter_port, addr=LOOPBACK, registry=registry)
    config = {"global": {"scrape_interval": "500ms"},
              "scrape_configs": [{"job_name": "sparrow", "static_configs": [{"targets": [f"{LOOPBACK}:{exporter_port}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address={LOOPBACK}:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    api = f"http://{LOOPBACK}:{prom_port}/api/v1"
    stop = threading.Event()
    feeder = threading.Thread(target=lambda: [(_feed(metrics), time.sleep(0.3)) for _ in iter(lambda: stop.is_set(), True)])
    feeder.start()
    try:
        def enough_samples() -> bool:
            response = httpx.get(f"{api}/query", params={"query": "count_over_time(up[1m])"})
            if response.status_code != 200:  # Prometheus answers 503 "Service Unavailable" while it starts
                return False
            result = response.json()["data"]["result"]
            return bool(result) and float(result[0]["value"][1]) >= 3

        # ~7 s when idle; the deadline only bounds a hang (Prometheus starting on a loaded 2-core CI box is slower)
        wait_until(enough_samples, 120, "three scrapes of the contract exporter (Prometheus waits ~5 s before the first)", interval_s=0.25)
        for expr in deploy_exprs()[str((DEPLOY_DIR / "grafana/dashboards/sparrow.json").relative_to(REPO_ROOT))]:
            query = expr
            for variable, value in GRAFANA_VARS.items():
                query = query.replace(variable, value)
            if query.startswith("label_values("):
                continue  # a Grafana function, not PromQL
            body = httpx.get(f"{api}/query", params={"query": query}).json()
            assert body["status"] == "success", f"{expr}: {body}"
            if "sparrow_" in expr:
                assert body["data"]["result"], f"no series for {expr}"
    finally:
        stop.set()
        feeder.join()
        proc.terminate()
        proc.wait(timeout=10)
        server.shutdown()
