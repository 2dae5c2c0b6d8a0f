"""collector-config/: every YAML parses, and every pipeline names only components its file
defines."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

CONFIG_DIR = REPO / "collector-config"
YAML_FILES = sorted(CONFIG_DIR.rglob("*.yaml"))
COLLECTOR_CONFIGS = [p for p in YAML_FILES if p.name.startswith("otelcol")]
SECTIONS = ("receivers", "processors", "exporters", "connectors")
# Renamed in collector v0.144 (otlp → otlp_grpc, otlphttp → otlp_http) or removed (logging → debug).
DEPRECATED_EXPORTERS = {"otlp", "otlphttp", "logging", "jaeger"}


def load(path: Path) -> dict:
    with open(path) as handle:
        return yaml.safe_load(handle)


def test_there_are_configs_for_jaeger_tempo_file_and_compose():
    names = {str(p.relative_to(CONFIG_DIR)) for p in YAML_FILES}
    assert {
        "jaeger/otelcol.yaml",
        "tempo/otelcol.yaml",
        "file-debug/otelcol.yaml",
        "compose/otelcol.yaml",
        "compose/docker-compose.yaml",
        "scale/otelcol-agent.yaml",
        "scale/otelcol-gateway.yaml",
    } <= names
    for folder in ("jaeger", "tempo", "file-debug", "compose"):
        assert (CONFIG_DIR / folder / "README.md").exists()


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_every_yaml_file_parses(path):
    assert isinstance(load(path), dict)


@pytest.mark.parametrize("path", COLLECTOR_CONFIGS, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_pipelines_use_only_defined_components(path):
    config = load(path)
    service = config["service"]
    assert service["pipelines"], "no pipeline"
    for name, pipeline in service["pipelines"].items():
        assert pipeline.get("receivers") and pipeline.get("exporters"), name
        for section in ("receivers", "processors", "exporters"):
            defined = set(config.get(section) or {}) | set(config.get("connectors") or {})
            for component in pipeline.get(section, []):
                assert component in defined, (
                    f"{path.name}: pipeline {name} uses {section[:-1]} {component!r}, not defined "
                    f"in {sorted(defined)}"
                )
    for extension in service.get("extensions", []):
        assert extension in (config.get("extensions") or {}), (
            f"{path.name}: extension {extension!r} not defined"
        )
    # Components defined but never used are probably a mistake.
    used = {
        c
        for p in service["pipelines"].values()
        for s in ("receivers", "processors", "exporters")
        for c in p.get(s, [])
    }
    for section in SECTIONS:
        for component in config.get(section) or {}:
            assert component in used, (
                f"{path.name}: {section[:-1]} {component!r} is defined but in no pipeline"
            )


@pytest.mark.parametrize("path", COLLECTOR_CONFIGS, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_current_component_names_and_otlp_ports(path):
    config = load(path)
    for exporter in config["exporters"]:
        assert exporter.split("/")[0] not in DEPRECATED_EXPORTERS, (
            f"{path.name}: {exporter!r} uses a deprecated name"
        )
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317") and protocols["http"][
        "endpoint"
    ].endswith(":4318")
    processors = config["service"]["pipelines"]["traces"].get("processors", [])
    if "memory_limiter" in processors:
        assert processors[0] == "memory_limiter"  # must run first to protect the collector


def test_compose_stack_wires_collector_jaeger_tempo_grafana():
    compose = load(CONFIG_DIR / "compose" / "docker-compose.yaml")
    services = compose["services"]
    assert set(services) == {"otel-collector", "jaeger", "tempo", "grafana"}
    for service in services.values():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), image  # pinned
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (CONFIG_DIR / "compose" / source).exists(), source
    assert {"4317:4317", "4318:4318"} <= set(services["otel-collector"]["ports"])
    collector = load(CONFIG_DIR / "compose" / "otelcol.yaml")
    endpoints = {
        name: exporter["endpoint"]
        for name, exporter in collector["exporters"].items()
        if "endpoint" in exporter
    }
    assert endpoints == {"otlp_grpc/jaeger": "jaeger:4317", "otlp_grpc/tempo": "tempo:4317"}
    tempo = load(CONFIG_DIR / "compose" / "tempo.yaml")
    assert tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(
        ":4317"
    )
    datasources = {
        d["type"]: d["url"]
        for d in load(CONFIG_DIR / "compose" / "grafana-datasources.yaml")["datasources"]
    }
    assert datasources == {"tempo": "http://tempo:3200", "jaeger": "http://jaeger:16686"}


def test_scale_agent_per_node_forwards_to_a_gateway_with_limits_batching_and_retries():
    """collector-config/scale: the agent (one per node) and the gateway tier of
    docs/collectors.md."""
    agent = load(CONFIG_DIR / "scale" / "otelcol-agent.yaml")
    gateway = load(CONFIG_DIR / "scale" / "otelcol-gateway.yaml")
    assert (CONFIG_DIR / "scale" / "README.md").exists()
    # The agent listens on the node's loopback (its ranks), the gateway on every interface (the
    # agents).
    assert agent["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].startswith(
        "${env:AGENT_LISTEN:-127.0.0.1}"
    )
    assert gateway["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] == "0.0.0.0:4317"
    for config in (agent, gateway):
        pipeline = config["service"]["pipelines"]["traces"]
        assert pipeline["processors"] == ["memory_limiter", "batch"]
        limiter = config["processors"]["memory_limiter"]
        assert limiter["check_interval"] and (
            "limit_mib" in limiter or "limit_percentage" in limiter
        )
        assert (
            config["processors"]["batch"]["send_batch_size"]
            <= config["processors"]["batch"]["send_batch_max_size"]
        )
        (exporter_name,) = pipeline["exporters"]
        exporter = config["exporters"][exporter_name]
        assert (
            exporter["sending_queue"]["enabled"] is True
            and exporter["sending_queue"]["queue_size"] > 0
        )
        assert (
            exporter["retry_on_failure"]["enabled"] is True
            and exporter["retry_on_failure"]["max_elapsed_time"]
        )
    assert (
        agent["exporters"]["otlp_grpc/gateway"]["endpoint"]
        == "${env:GATEWAY_ENDPOINT:-otel-gateway:4317}"
    )
    assert gateway["exporters"]["otlp_grpc/backend"]["endpoint"].startswith(
        "${env:BACKEND_ENDPOINT"
    )
