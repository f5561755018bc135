"""deploy/kubernetes: every manifest validated offline against the official
OpenAPI schemas (kubernetes-validate, strict: an unknown or misspelt field
fails), for the oldest and the newest Kubernetes minor it bundles that we
claim, and the consistency across files: labels and selectors, ports and
probe paths against the ConfigMap's sockherd.toml, the grace period against
preStop + unready_delay + hard_stop_after, the config checksum annotation,
and the runtime directory against the emptyDir."""
from __future__ import annotations

import hashlib
import re
import shlex
import tomllib
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kv = pytest.importorskip("kubernetes_validate",
                         reason="kubernetes-validate is not installed (the test extra)")

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "deploy" / "kubernetes"
FILES = sorted(HERE.glob("*.yaml"))
VERSIONS = ["1.27.0", "1.33.0"]            # oldest and a recent supported minor

pytestmark = pytest.mark.timeout(60)


def documents() -> list[tuple[Path, dict]]:
    out = []
    for path in FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append((path, doc))
    return out


@pytest.fixture(scope="module")
def by_kind() -> dict[str, dict]:
    found: dict[str, dict] = {}
    for path, doc in documents():
        assert doc["kind"] not in found, f"two {doc['kind']}s ({path.name})"
        found[doc["kind"]] = doc
    assert set(found) == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
    return found


@pytest.fixture(scope="module")
def toml_text(by_kind) -> str:
    return by_kind["ConfigMap"]["data"]["sockherd.toml"]


@pytest.fixture(scope="module")
def settings(toml_text) -> dict:
    return tomllib.loads(toml_text)


@pytest.fixture(scope="module")
def pod(by_kind) -> dict:
    return by_kind["Deployment"]["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def container(pod) -> dict:
    (c,) = pod["containers"]
    return c


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def named_port(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return number


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_manifest_validates_against_the_schema(path, version):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, f"{path.name}: no document"
    for doc in docs:
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{path.name} ({doc.get('kind')}) against {version}: "
                        f"{'.'.join(map(str, exc.path))}: {exc.message}")


def test_schema_validation_is_strict():
    """Control: a misspelt field and a wrong type are refused."""
    (doc,) = yaml.safe_load_all((HERE / "deployment.yaml").read_text())
    doc["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(doc, VERSIONS[-1], strict=True)
    (doc,) = yaml.safe_load_all((HERE / "deployment.yaml").read_text())
    doc["spec"]["replicas"] = "3"
    with pytest.raises(kv.ValidationError):
        kv.validate(doc, VERSIONS[-1], strict=True)


def test_configmap_settings_decode(toml_text, tmp_path):
    """The ConfigMap's sockherd.toml through sockherd's own settings code."""
    from sockherd.master import settings as S

    path = tmp_path / "sockherd.toml"
    path.write_text(toml_text)
    got = S.resolve({}, config=str(path))
    assert got.app and got.workers > 0      # 0 would count the node's CPUs
    assert got.metrics and got.unready_delay > 0


def test_labels_and_selectors(by_kind):
    dep = by_kind["Deployment"]
    selector = dep["spec"]["selector"]["matchLabels"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert by_kind["Service"]["spec"]["selector"] == selector
    assert by_kind["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == selector
    spread = dep["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert all(c["labelSelector"]["matchLabels"] == selector for c in spread)
    # the PDB lets at least one pod go, and never all of them
    pdb = by_kind["PodDisruptionBudget"]["spec"]
    assert 0 < pdb["maxUnavailable"] < dep["spec"]["replicas"]


def test_ports_and_probes_match_the_settings(by_kind, container, settings):
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert [port_of(b) for b in settings["bind"]] == [ports["http"]]
    assert port_of(settings["metrics"]) == ports["metrics"]
    for address in [*settings["bind"], settings["metrics"]]:
        assert address.startswith("0.0.0.0:"), f"{address}: not reachable from the kubelet"
    ready = container["readinessProbe"]["httpGet"]
    assert ready["path"] == "/-/ready"
    assert named_port(container, ready["port"]) == port_of(settings["metrics"])
    live = container["livenessProbe"]
    assert "tcpSocket" in live, "liveness: a tcpSocket on the metrics listener (see the manifest)"
    assert named_port(container, live["tcpSocket"]["port"]) == port_of(settings["metrics"])
    assert named_port(container, container["startupProbe"]["tcpSocket"]["port"]) \
        == port_of(settings["metrics"])
    (svc_port,) = by_kind["Service"]["spec"]["ports"]
    assert named_port(container, svc_port["targetPort"]) == ports["http"]
    notes = by_kind["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"
    assert int(notes["prometheus.io/port"]) == port_of(settings["metrics"])


def prestop(container) -> tuple[list[str], float]:
    """The preStop hook's commands (after sh -c) and its sleep."""
    cmd = container["lifecycle"]["preStop"]["exec"]["command"]
    assert cmd[:2] == ["sh", "-c"], cmd
    steps = [shlex.split(s) for s in cmd[2].split(";")]
    (sleep,) = [float(s[1]) for s in steps if s[0] == "sleep"]
    return [" ".join(s) for s in steps if s], sleep


def test_graceful_stop_timing(pod, container, settings):
    """preStop: `sockherd ctl stop` (unready at once, serve unready_delay,
    drain), then sleep unready_delay; the grace period covers that sleep plus
    a whole graceful stop begun by the TERM that follows (should ctl fail)."""
    steps, sleep = prestop(container)
    assert steps[0] == "sockherd ctl stop", steps       # graceful, not --fast
    assert sleep == settings["unready_delay"]
    grace = pod["terminationGracePeriodSeconds"]
    need = sleep + settings["unready_delay"] + settings["hard_stop_after"]
    assert grace > need, f"terminationGracePeriodSeconds {grace} <= {need}"
    # the readiness probe notices a stop within unready_delay
    probe = container["readinessProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] <= settings["unready_delay"]


def test_rolling_update_never_lowers_capacity(by_kind):
    spec = by_kind["Deployment"]["spec"]
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["strategy"]["rollingUpdate"]["maxSurge"] >= 1


def test_config_checksum_annotation(by_kind, toml_text):
    """A ConfigMap change must change the pod template (so `kubectl apply`
    rolls the pods): the annotation is the sha256 of the settings text."""
    want = hashlib.sha256(toml_text.encode()).hexdigest()
    got = by_kind["Deployment"]["spec"]["template"]["metadata"]["annotations"][
        "sockherd.io/config-sha256"]
    assert got == want, (f"deployment.yaml: set sockherd.io/config-sha256: {want} "
                         f"(configmap.yaml's sockherd.toml changed)")


def test_config_mount_and_runtime_dir(by_kind, pod, container):
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config = Path(env["SOCKHERD_CONFIG"])
    mount = mounts[str(config.parent)]
    # a directory mount (never subPath): the kubelet refreshes it, so that
    # `sockherd ctl reload` can pick a change up in place
    assert "subPath" not in mount and mount["readOnly"] is True
    cm = volumes[mount["name"]]["configMap"]
    assert cm["name"] == by_kind["ConfigMap"]["metadata"]["name"]
    assert config.name in by_kind["ConfigMap"]["data"]
    # sockherd creates its runtime dir 0700 for itself: inside an emptyDir
    runtime = Path(env["SOCKHERD_RUNTIME_DIR"])
    assert "emptyDir" in volumes[mounts[str(runtime.parent)]["name"]]
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]


def test_security_context_and_resources(pod, container):
    sc, psc = container["securityContext"], pod["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    # the image's numeric USER (deploy/container/Containerfile)
    containerfile = (ROOT / "deploy" / "container" / "Containerfile").read_text()
    assert re.search(rf"^USER {psc['runAsUser']}:{psc['runAsGroup']}$", containerfile, re.M)
    assert container["resources"]["requests"]["cpu"] and \
        container["resources"]["limits"]["memory"]
    assert container["args"] == ["run"]
