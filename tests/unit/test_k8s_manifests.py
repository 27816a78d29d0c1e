"""The Kubernetes manifests under deploy/k8s (docs/deploy-kubernetes.md), checked offline.

* Every built-in object validates against the Kubernetes OpenAPI schemas of ``K8S_VERSION``, strictly
  (an unknown field is an error, as with kubectl's default server-side field validation), with
  kubernetes-validate, which bundles those schemas. The RayCluster is a CRD that validator does not
  know: it is checked with jsonschema against deploy/k8s/schemas/raycluster-ray.io-v1.json (trimmed
  from KubeRay's CRD), and its pod templates with kubernetes-validate as core/v1 PodTemplates.
* Names resolve: every Secret, key, volume, port and Service the pods use exists in the manifests,
  and every file a gfaas command reads is mounted in that container.
* The contracts between the pieces hold: the node daemon's node id is what the Ray worker on the
  same machine advertises as ``gfaas_node_<id>``; both share the host's IPC namespace and /run/gfaas.

Nothing here talks to a cluster; what was never run is listed in the docs.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (the dev extra) is not installed")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the dev extra) is not installed")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
K8S_VERSION = "1.33.0"  # the schemas the manifests must satisfy; named in docs/deploy-kubernetes.md
RAY_SCHEMA = K8S / "schemas" / "raycluster-ray.io-v1.json"
SECRETS_TEMPLATE = "secrets.example.yaml"
NAMESPACE = "gfaas"
SAMPLE_NODE = "ip-10-0-1-5.ec2.internal"  # a typical Kubernetes node name
SERVICE_ADDRESS = re.compile(r"([a-z0-9-]+)\.([a-z0-9-]+)\.svc:(\d+)")  # name.namespace.svc:port in commands


def _manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _objects() -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, d) for p in _manifest_files() for d in _load(p)]


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [d for _, d in _objects() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _pod_templates(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, pod template) of a workload object."""
    name = f"{obj['kind']}/{obj['metadata']['name']}"
    if obj["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
        return [(name, obj["spec"]["template"])]
    if obj["kind"] == "RayCluster":
        spec = obj["spec"]
        return [(f"{name} head", spec["headGroupSpec"]["template"])] + [
            (f"{name} {g['groupName']}", g["template"]) for g in spec.get("workerGroupSpecs", [])]
    return []


def _container(template: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in template["spec"]["containers"] if c["name"] == name]
    assert found, f"no container {name}"
    return found[0]


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _arg(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {' '.join(command)}"
    return command[command.index(flag) + 1]


def _problems(name: str, obj: dict[str, Any]) -> list[str]:
    """Schema errors of one object ([] when it validates)."""
    where = f"{name}: {obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    if obj.get("kind") == "RayCluster":
        schema = json.loads(RAY_SCHEMA.read_text(encoding="utf-8"))
        out = [f"{where}: {'.'.join(map(str, e.absolute_path))}: {e.message}"
               for e in jsonschema.Draft202012Validator(schema).iter_errors(obj)]
        if out:
            return out
        for label, tpl in _pod_templates(obj):
            pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": tpl}
            out += [f"{where} ({label}): {p}" for p in _problems(name, pod)]
        return out
    try:
        kv.validate(obj, K8S_VERSION, strict=True)
    except kv.ValidationError as e:
        return [f"{where}: {'.'.join(map(str, e.path))}: {e.message}"]
    except (kv.SchemaNotFoundError, kv.InvalidSchemaError) as e:
        return [f"{where}: {e.message}"]
    return []


# ---- schemas ------------------------------------------------------------------------------------------

def test_every_manifest_validates() -> None:
    objs = _objects()
    kinds = {d["kind"] for _, d in objs}
    assert {"Namespace", "Secret", "Deployment", "Service", "DaemonSet", "RayCluster"} <= kinds, kinds
    problems = [p for name, obj in objs for p in _problems(name, obj)]
    assert not problems, "\n".join(problems)


def _mutated(kind: str, name: str, change: Any) -> dict[str, Any]:
    obj = copy.deepcopy(_one(kind, name))
    change(obj)
    return obj


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def _worker(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["workerGroupSpecs"][0]


BAD = {
    "misspelled pod field": ("DaemonSet", "gfaas-node", lambda o: _pod(o).update(hostIpc=True)),
    "port as a string": ("DaemonSet", "gfaas-node",
                         lambda o: _pod(o)["containers"][0]["ports"][0].update(containerPort="7070")),
    "misspelled Service field": ("Service", "gfaas-redis", lambda o: o["spec"].update(selectors={})),
    "misspelled RayCluster field": ("RayCluster", "gfaas-ray",
                                    lambda o: o["spec"].update(workerGroupSpec=o["spec"]["workerGroupSpecs"])),
    "rayStartParams value not a string": ("RayCluster", "gfaas-ray",
                                          lambda o: o["spec"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": 0})),
    "worker group without maxReplicas": ("RayCluster", "gfaas-ray", lambda o: _worker(o).pop("maxReplicas")),
    "misspelled field in a Ray pod template": ("RayCluster", "gfaas-ray",
                                               lambda o: _worker(o)["template"]["spec"]["containers"][0].update(
                                                   volumeMount=[])),
    "unknown auth mode": ("RayCluster", "gfaas-ray", lambda o: o["spec"]["authOptions"].update(mode="tokens")),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_broken_manifests_are_rejected(case: str) -> None:
    kind, name, change = BAD[case]
    assert not _problems("original", _one(kind, name))
    assert _problems("broken", _mutated(kind, name, change)), f"{case} was accepted"


# ---- names resolve ------------------------------------------------------------------------------------

def _secrets() -> dict[str, set[str]]:
    """Secret name -> its keys, from the templates (the real ones are created with kubectl, same names)."""
    out = {}
    for d in _load(K8S / SECRETS_TEMPLATE):
        assert d["kind"] == "Secret"
        out[d["metadata"]["name"]] = set(d.get("stringData", {})) | set(d.get("data", {}))
    return out


def test_kustomization_lists_every_manifest_but_the_secret_templates() -> None:
    kust = _load(K8S / "kustomization.yaml")[0]
    listed = set(kust["resources"])
    assert all((K8S / r).is_file() for r in listed), listed
    assert listed == {p.name for p in _manifest_files()} - {SECRETS_TEMPLATE}
    assert {i["name"] for i in kust["images"]} == {"gfaas"}


def test_secret_templates_hold_placeholders_only() -> None:
    for d in _load(K8S / SECRETS_TEMPLATE):
        assert d["metadata"]["namespace"] == NAMESPACE
        assert "data" not in d
        for key, value in d["stringData"].items():
            assert value.startswith("REPLACE-"), f"{d['metadata']['name']}/{key} looks like a real value"


def test_every_reference_resolves() -> None:
    secrets = _secrets()
    services = {d["metadata"]["name"]: d for _, d in _objects() if d["kind"] == "Service"}
    configmaps = {d["metadata"]["name"] for _, d in _objects() if d["kind"] == "ConfigMap"}
    bad: list[str] = []
    templates = [t for _, d in _objects() for t in _pod_templates(d)]
    assert len(templates) == 4, [w for w, _ in templates]  # Redis, the node daemon, Ray's head and workers
    for where, tpl in templates:
        spec = tpl["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for v in volumes.values():
            if "secret" in v and v["secret"]["secretName"] not in secrets:
                bad.append(f"{where}: volume {v['name']}: no Secret {v['secret']['secretName']}")
            if "configMap" in v and v["configMap"]["name"] not in configmaps:
                bad.append(f"{where}: volume {v['name']}: no ConfigMap {v['configMap']['name']}")
        for c in spec.get("initContainers", []) + spec["containers"]:
            for m in c.get("volumeMounts", []):
                v = volumes.get(m["name"])
                if v is None:
                    bad.append(f"{where}/{c['name']}: mounts unknown volume {m['name']}")
                elif "subPath" in m and "secret" in v and m["subPath"] not in secrets.get(v["secret"]["secretName"], ()):
                    bad.append(f"{where}/{c['name']}: Secret {v['secret']['secretName']} has no key {m['subPath']}")
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["key"] not in secrets.get(ref["name"], ()):
                    bad.append(f"{where}/{c['name']}: env {e['name']}: no Secret key {ref['name']}/{ref['key']}")
                ref = e.get("valueFrom", {}).get("configMapKeyRef")
                if ref and ref["name"] not in configmaps:
                    bad.append(f"{where}/{c['name']}: env {e['name']}: no ConfigMap {ref['name']}")
            command = c.get("command", []) + c.get("args", [])
            for i, word in enumerate(command[:-1]):  # every file a gfaas flag reads is mounted right there
                if word.endswith("-file") and not any(m["mountPath"] == command[i + 1] for m in c.get("volumeMounts", [])):
                    bad.append(f"{where}/{c['name']}: {word} {command[i + 1]} is not a mount of this container")
            for svc_name, ns, port in SERVICE_ADDRESS.findall(" ".join(command)):
                svc = services.get(svc_name)
                if svc is None or ns != NAMESPACE or int(port) not in {p["port"] for p in svc["spec"]["ports"]}:
                    bad.append(f"{where}/{c['name']}: {svc_name}.{ns}.svc:{port} is no Service port here")
    for name, svc in services.items():  # each Service selects a pod template and names its ports
        sel = svc["spec"]["selector"]
        targets = [(w, t) for w, t in templates if sel.items() <= t["metadata"].get("labels", {}).items()]
        if len(targets) != 1:
            bad.append(f"Service {name} selects {len(targets)} pod templates")
            continue
        ports = {p.get("name") for c in targets[0][1]["spec"]["containers"] for p in c.get("ports", [])}
        bad += [f"Service {name}: no container port {p['targetPort']}" for p in svc["spec"]["ports"]
                if isinstance(p["targetPort"], str) and p["targetPort"] not in ports]
    ray = _one("RayCluster", "gfaas-ray")
    if ray["spec"]["authOptions"]["secretName"] not in secrets or \
            "auth_token" not in secrets[ray["spec"]["authOptions"]["secretName"]]:
        bad.append("RayCluster authOptions.secretName: no such Secret with key auth_token (KubeRay's key name)")
    assert not bad, "\n".join(bad)


def test_everything_is_in_one_namespace() -> None:
    for name, d in _objects():
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == NAMESPACE, f"{name}: {d['kind']} {d['metadata']['name']}"
    assert _one("Namespace", NAMESPACE)


# ---- contracts between the pieces ---------------------------------------------------------------------

def _field_ref(env: dict[str, dict[str, Any]], name: str) -> str:
    return env[name]["valueFrom"]["fieldRef"]["fieldPath"]


def _mount_of(template: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"] == path]
    assert len(mounts) == 1, f"{container['name']}: nothing mounted at {path}"
    return next(v for v in template["spec"]["volumes"] if v["name"] == mounts[0]["name"])


def test_node_daemonset() -> None:
    ds = _one("DaemonSet", "gfaas-node")
    tpl = ds["spec"]["template"]
    pod = tpl["spec"]
    assert pod["hostIPC"] is True
    assert not pod.get("hostNetwork", False)  # the pod IP is advertised instead
    node = _container(tpl, "node")
    assert int(node["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    env = _env(node)
    assert _field_ref(env, "NODE_NAME") == "spec.nodeName"
    assert _field_ref(env, "POD_IP") == "status.podIP"
    cmd = node["command"]
    assert cmd[:4] == ["gfaas", "node", "start", "--foreground"]
    assert _arg(cmd, "--node-id") == "$(NODE_NAME)"
    assert _arg(cmd, "--transfer-host") == "$(POD_IP)"
    assert _arg(cmd, "--join") == f"redis://gfaas-redis.{NAMESPACE}.svc:6379/0"
    assert int(_arg(cmd, "--transfer-port")) in {p["containerPort"] for p in node["ports"]}
    assert _arg(cmd, "--socket").startswith("/run/gfaas/")
    assert _mount_of(tpl, node, "/run/gfaas")["hostPath"]["path"] == "/run/gfaas"
    # The state (admin token) stays in the daemon's pod, outside what the Ray workers mount (issue 37 row 1).
    state = _arg(cmd, "--state-dir")
    assert not state.startswith("/run/gfaas")
    assert "emptyDir" in _mount_of(tpl, node, state)
    int(_arg(cmd, "--socket-group"))
    for flag in ("--cluster-key-file", "--redis-password-file"):
        _check_secret_file(tpl, node, _arg(cmd, flag))


def _check_secret_file(tpl: dict[str, Any], container: dict[str, Any], path: str) -> None:
    """gfaas reads a secret only from a regular file (not a symlink, as Secret volume entries are: so a
    subPath mount) that nobody but its owner can read (0400, and no fsGroup adding group bits)."""
    vol = _mount_of(tpl, container, path)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == path)
    assert mount.get("subPath") and mount.get("readOnly") is True, mount
    assert vol["secret"]["defaultMode"] == 0o400, vol
    assert "fsGroup" not in tpl["spec"].get("securityContext", {})


def test_ray_workers_advertise_their_node() -> None:
    ray = _one("RayCluster", "gfaas-ray")
    node_tpl = _one("DaemonSet", "gfaas-node")["spec"]["template"]
    workers = ray["spec"]["workerGroupSpecs"]
    assert workers
    for group in workers:
        tpl = group["template"]
        assert tpl["spec"]["hostIPC"] is True
        assert tpl["spec"]["nodeSelector"] == node_tpl["spec"]["nodeSelector"]  # a daemon beside each worker
        worker = tpl["spec"]["containers"][0]  # KubeRay's Ray container is the first one
        names = [e["name"] for e in worker["env"]]
        env = _env(worker)
        # Kubernetes expands $(NODE_NAME) only from variables defined earlier in the list.
        assert names.index("NODE_NAME") < names.index("RAY_OVERRIDE_RESOURCES")
        assert _field_ref(env, "NODE_NAME") == _field_ref(_env(_container(node_tpl, "node")), "NODE_NAME")
        value = env["RAY_OVERRIDE_RESOURCES"]["value"].replace("$(NODE_NAME)", SAMPLE_NODE)
        assert json.loads(value) == {f"gfaas_node_{SAMPLE_NODE}": 1000}
        assert _mount_of(tpl, worker, "/run/gfaas")["hostPath"]["path"] == "/run/gfaas"
        assert 0 <= group["minReplicas"] <= group.get("replicas", 0) <= group["maxReplicas"]
        # Function code runs here without gfaas's sandbox: not as root, reaching the daemon's socket
        # through its group only, mounting nothing of the daemon's state (issue 37 row 1).
        ctx = tpl["spec"]["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] > 0 and ctx["runAsGroup"] > 0
        socket_group = int(_arg(_container(node_tpl, "node")["command"], "--socket-group"))
        assert socket_group in ctx["supplementalGroups"]
        assert worker["securityContext"]["allowPrivilegeEscalation"] is False
        assert worker["securityContext"]["capabilities"]["drop"] == ["ALL"]
        state = _arg(_container(node_tpl, "node")["command"], "--state-dir")
        assert not any(state.startswith(m["mountPath"]) for m in worker["volumeMounts"])


def test_gateway_runs_beside_the_ray_head() -> None:
    ray = _one("RayCluster", "gfaas-ray")
    head = ray["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # functions run on the workers
    tpl = head["template"]
    pod = tpl["spec"]
    assert pod["containers"][0]["name"] == "ray-head"  # KubeRay's Ray container is the first one
    gw = _container(tpl, "gateway")
    cmd = gw["command"]
    assert cmd[:2] == ["gfaas", "serve"]
    assert _arg(cmd, "--executor") == "ray"
    assert _arg(cmd, "--ray-address") == "$(POD_IP):6379"
    assert _arg(cmd, "--join") == f"redis://gfaas-redis.{NAMESPACE}.svc:6379/0"
    assert _arg(cmd, "--host") == "0.0.0.0"
    # A Ray driver attaches to a raylet it finds among its host's processes, through Ray's session dir.
    assert pod["shareProcessNamespace"] is True
    for c in pod["containers"]:
        assert _mount_of(tpl, c, "/tmp/ray")["emptyDir"] == {}
    port = int(_arg(cmd, "--port"))
    http = next(p for p in gw["ports"] if p["name"] == "http")
    assert http["containerPort"] == port
    assert gw["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # No two processes of the pod on one port: KubeRay's default metrics port is 8080.
    assert int(head["rayStartParams"].get("metrics-export-port", 8080)) != port
    ports = [p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])]
    assert len(ports) == len(set(ports)), ports
    env = _env(gw)
    assert env["RAY_AUTH_MODE"]["value"] == "token" and ray["spec"]["authOptions"]["mode"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": ray["spec"]["authOptions"]["secretName"], "key": "auth_token"}
    for flag in ("--cluster-key-file", "--redis-password-file", "--token-file"):
        _check_secret_file(tpl, gw, _arg(cmd, flag))
    svc = _one("Service", "gfaas-gateway")
    assert svc["spec"]["ports"][0]["port"] == port


def test_ray_version_matches_the_image() -> None:
    dockerfile = (ROOT / "deploy" / "container" / "Dockerfile").read_text(encoding="utf-8")
    m = re.search(r"^ARG RAY_VERSION=(\S+)$", dockerfile, re.M)
    assert m, "Dockerfile: no ARG RAY_VERSION"
    assert _one("RayCluster", "gfaas-ray")["spec"]["rayVersion"] == m.group(1)
    assert re.search(r"^ARG BASE=", dockerfile, re.M) and re.search(r"^ARG EXTRAS=ray$", dockerfile, re.M)


def test_docs_name_the_validator_and_version() -> None:
    doc = (ROOT / "docs" / "deploy-kubernetes.md").read_text(encoding="utf-8")
    major_minor = ".".join(K8S_VERSION.split(".")[:2])
    assert "kubernetes-validate" in doc and f"Kubernetes {major_minor}" in doc
    assert "What was and was not run" in doc
