#!/usr/bin/python3
"""Validates deploy/k8s without a cluster: lint, render, schema, invariants.

  deploy/k8s/check.py [--self-test] [--kubectl PATH|none] [-v]

1. yamllint (Debian's yamllint) over every file, with deploy/k8s/.yamllint.
2. Renders each overlay: with the kustomize subset the manifests use
   (resources, configMapGenerator, generatorOptions, images, strategic-merge
   patches), implemented here so that a plain Debian 12 machine can run it
   (Debian's kubectl 1.20 embeds kustomize 2.0.3, too old for `patches`);
   where a kubectl with kustomize is installed, its rendering must give the
   same objects.
3. Schema: every object against the Kubernetes API models of Debian's
   python3-kubernetes (the 1.22 API, generated from Kubernetes' OpenAPI
   spec): unknown fields, wrong types and missing required fields are
   errors. Fields newer than 1.22 that the manifests use are declared in
   NEWER_FIELDS below, with the release that added them.
4. Invariants of this deployment (what a schema cannot see): names and
   selectors agree, probes are gRPC on the daemon's port, the grace period
   outlasts preStop + drain delay + drain, the pod runs as the image's
   non-root user on a read-only root, the metrics annotations match the
   metrics port, each overlay asks for its vendor's GPU and --device=gpu:0,
   and the ConfigMap's profile is a shipped one, byte for byte; the three
   Dockerfiles agree with the manifests (user, port, health check, layout).

--self-test breaks the rendered objects in the ways listed in MUTATIONS and
fails unless every one is reported: the checks can fail.
Exit status 0 when everything holds; every problem is printed.
"""
import argparse
import copy
import os
import re
import shutil
import subprocess
import sys

import yaml
import kubernetes.client.models as k8s_models
from kubernetes.client.configuration import Configuration

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OVERLAYS = {"cpu": None, "nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
IMAGE_UID = 10001  # USER in deploy/docker/Dockerfile.* (checked below)

# -------------------------------------------------------------- rendering --

# Strategic-merge keys of the list fields the patches touch (Kubernetes'
# patchMergeKey for each); any other list is replaced, as kustomize does.
MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name",
              "env": "name", "volumeMounts": "mountPath", "ports": "containerPort"}


def merge(base, patch):
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if key in out and key in MERGE_KEYS and isinstance(value, list):
                mk = MERGE_KEYS[key]
                items = [dict(i) for i in out[key]]
                for p in value:
                    match = [i for i, b in enumerate(items) if b.get(mk) == p.get(mk)]
                    if match:
                        items[match[0]] = merge(items[match[0]], p)
                    else:
                        items.append(p)
                out[key] = items
            elif key in out:
                out[key] = merge(out[key], value)
            else:
                out[key] = value
        return out
    return copy.deepcopy(patch)


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def render(directory):
    """The objects `kustomize build directory` gives, for the subset used."""
    kfile = os.path.join(directory, "kustomization.yaml")
    (k,) = load_docs(kfile)
    known = {"apiVersion", "kind", "resources", "configMapGenerator",
             "generatorOptions", "images", "patches"}
    unknown = set(k) - known
    if unknown:
        raise ValueError(f"{kfile}: {sorted(unknown)} is outside the subset check.py renders "
                         f"(expected only {sorted(known)})")
    objects = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(directory, r))
        objects += render(p) if os.path.isdir(p) else load_docs(p)
    hash_off = k.get("generatorOptions", {}).get("disableNameSuffixHash", False)
    for gen in k.get("configMapGenerator", []):
        if not hash_off:
            raise ValueError(f"{kfile}: configMapGenerator needs disableNameSuffixHash "
                             "(check.py does not compute kustomize's name hash)")
        data = {}
        for spec in gen.get("files", []):
            key, _, rel = spec.rpartition("=")
            with open(os.path.join(directory, rel)) as f:
                data[key or os.path.basename(rel)] = f.read()
        objects.append({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": gen["name"]}, "data": data})
    for p in k.get("patches", []):
        if set(p) != {"path"}:
            raise ValueError(f"{kfile}: only `patches: - path: FILE` is rendered here")
        (patch,) = load_docs(os.path.join(directory, p["path"]))
        targets = [i for i, o in enumerate(objects)
                   if o["kind"] == patch["kind"] and
                   o["metadata"]["name"] == patch["metadata"]["name"]]
        if len(targets) != 1:
            raise ValueError(f"{p['path']}: expected one {patch['kind']} "
                             f"{patch['metadata']['name']}, found {len(targets)}")
        objects[targets[0]] = merge(objects[targets[0]], patch)
    for img in k.get("images", []):
        for o in objects:
            for c in pod_spec(o).get("containers", []) if pod_spec(o) else []:
                name, _, tag = c["image"].partition(":")
                if name == img["name"]:
                    c["image"] = f"{img.get('newName', name)}:{img.get('newTag', tag)}"
    return objects


def pod_spec(obj):
    return obj.get("spec", {}).get("template", {}).get("spec") if obj.get(
        "kind") == "StatefulSet" else None


def kubectl_render(kubectl, directory):
    out = subprocess.run([kubectl, "kustomize", directory], check=True,
                         capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d is not None]


def by_key(objects):
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


# ----------------------------------------------------------------- schema --

KINDS = {("v1", "Service"): "V1Service", ("v1", "ConfigMap"): "V1ConfigMap",
         ("apps/v1", "StatefulSet"): "V1StatefulSet",
         ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget"}
# Fields added after the 1.22 API of python3-kubernetes: model -> {json
# field: type}. Types are model names or NEWER_TYPES keys.
NEWER_FIELDS = {"V1Probe": {"grpc": "GRPCAction"}}  # Kubernetes 1.24 (beta), 1.27 (GA)
NEWER_TYPES = {"GRPCAction": ({"port": "int", "service": "str"}, {"port"})}
# resource.Quantity is int-or-string in the API; the Python models say str.
QUANTITY_MAPS = {"V1ResourceRequirements": {"limits", "requests"}}
PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def model_fields(name):
    """{json name: (type, required)} of a model."""
    if name in NEWER_TYPES:
        types, required = NEWER_TYPES[name]
        return {k: (t, k in required) for k, t in types.items()}
    klass = getattr(k8s_models, name)
    conf = Configuration()
    conf.client_side_validation = True
    fields = {}
    for attr, t in klass.openapi_types.items():
        obj = klass.__new__(klass)
        obj.local_vars_configuration = conf
        try:
            setattr(obj, attr, None)  # the generated setters refuse None when required
            required = False
        except ValueError:
            required = True
        fields[klass.attribute_map[attr]] = (t, required)
    for k, t in NEWER_FIELDS.get(name, {}).items():
        fields[k] = (t, False)
    for k in QUANTITY_MAPS.get(name, ()):
        fields[k] = ("dict(str, object)", fields[k][1])
    return fields


def check_schema(value, t, path, errors):
    if t == "object":  # int-or-string, quantities, free-form
        if not isinstance(value, (str, int, float, dict)):
            errors.append(f"{path}: expected int-or-string, got {type(value).__name__}")
        return
    m = re.fullmatch(r"list\[(.+)\]", t)
    if m:
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            check_schema(v, m.group(1), f"{path}[{i}]", errors)
        return
    m = re.fullmatch(r"dict\(str, (.+)\)", t)
    if m:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map, got {type(value).__name__}")
            return
        for k, v in value.items():
            check_schema(v, m.group(1), f"{path}.{k}", errors)
        return
    if t in PRIMITIVES:
        ok = isinstance(value, PRIMITIVES[t]) and not (t in ("int", "float") and
                                                         isinstance(value, bool))
        if not ok:
            errors.append(f"{path}: expected {t}, got {type(value).__name__} {value!r}")
        return
    if t == "datetime":
        return
    if not isinstance(value, dict):
        errors.append(f"{path}: expected a {t} object, got {type(value).__name__}")
        return
    fields = model_fields(t)
    for k, v in value.items():
        if k not in fields:
            errors.append(f"{path}.{k}: unknown field of {t} (expected one of "
                          f"{', '.join(sorted(fields))})")
        else:
            check_schema(v, fields[k][0], f"{path}.{k}", errors)
    for k, (_, required) in fields.items():
        if required and k not in value:
            errors.append(f"{path}: missing required field {k} of {t}")


# ------------------------------------------------------------- invariants --

def flags(args):
    out = {}
    for a in args:
        k, _, v = a.partition("=")
        out[k] = v
    return out


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def check_invariants(overlay, objects, errors):
    def err(msg):
        errors.append(f"{overlay}: {msg}")
    kinds = {}
    for o in objects:
        kinds.setdefault(o["kind"], []).append(o)
    try:
        (sts,) = kinds["StatefulSet"]
        (svc,) = kinds["Service"]
        (pdb,) = kinds["PodDisruptionBudget"]
        (cm,) = kinds["ConfigMap"]
    except (KeyError, ValueError):
        err(f"expected one StatefulSet, Service, PodDisruptionBudget and ConfigMap, got "
            f"{ {k: len(v) for k, v in kinds.items()} }")
        return
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"].get("labels", {})

    def selects(selector):
        return bool(selector) and all(labels.get(k) == v for k, v in selector.items())
    if not selects(spec.get("selector", {}).get("matchLabels")):
        err("StatefulSet selector does not match its pod labels")
    if spec.get("serviceName") != svc["metadata"]["name"]:
        err(f"serviceName {spec.get('serviceName')!r}: expected the headless Service "
            f"{svc['metadata']['name']!r}")
    if svc["spec"].get("clusterIP") != "None":
        err("Service: expected clusterIP None (headless: one DNS name per daemon)")
    if not selects(svc["spec"].get("selector")):
        err("Service selector does not match the pod labels")
    if not selects(pdb["spec"].get("selector", {}).get("matchLabels")):
        err("PodDisruptionBudget selector does not match the pod labels")

    (c,) = [c for c in pod["containers"] if c["name"] == "indexerd"]
    f = flags(c.get("args", []))
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    grpc_port = port_of(f.get("--listen", ":-1"))
    if ports.get("grpc") != grpc_port:
        err(f"--listen port {grpc_port}: expected the container port grpc ({ports.get('grpc')})")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(probe)
        handlers = [h for h in ("exec", "httpGet", "tcpSocket", "grpc") if p and h in p]
        if handlers != ["grpc"] or p["grpc"].get("port") != grpc_port:
            err(f"{probe}: expected a grpc probe on port {grpc_port}, got {p!r}")
    svc_ports = {p["name"]: p for p in svc["spec"].get("ports", [])}
    if svc_ports.get("grpc", {}).get("targetPort") not in ("grpc", grpc_port):
        err("Service port grpc does not target the daemon's port")

    # The drain: preStop, then SIGTERM -> NOT_SERVING, --drain-delay-ms,
    # then open steps for up to --drain-ms; SIGKILL at the grace period.
    pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    pre_s = float(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else None
    if pre_s is None:
        err(f"preStop: expected [sleep, SECONDS], got {pre!r}")
        pre_s = 0
    try:
        drain_s = (int(f["--drain-delay-ms"]) + int(f["--drain-ms"])) / 1000
    except (KeyError, ValueError):
        err("args: expected --drain-delay-ms=N and --drain-ms=N")
        drain_s = 0
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace <= pre_s + drain_s:
        err(f"terminationGracePeriodSeconds {grace}: expected more than preStop {pre_s:g} s "
            f"+ drain delay and drain {drain_s:g} s")
    live = c.get("livenessProbe", {})
    if live.get("periodSeconds", 10) * live.get("failureThreshold", 3) < drain_s:
        err("livenessProbe: a drain (NOT_SERVING) would outlast it and get the pod killed")

    # Security: the image's non-root user, read-only root.
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    if not psc.get("runAsNonRoot") or psc.get("runAsUser") != IMAGE_UID:
        err(f"pod securityContext: expected runAsNonRoot and runAsUser {IMAGE_UID}")
    if not csc.get("readOnlyRootFilesystem") or csc.get("allowPrivilegeEscalation", True):
        err("container securityContext: expected readOnlyRootFilesystem true and "
            "allowPrivilegeEscalation false")
    if "ALL" not in csc.get("capabilities", {}).get("drop", []):
        err("container securityContext: expected capabilities.drop [ALL]")
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    if "/tmp" not in mounts:
        err("expected a writable volume at /tmp (the root filesystem is read-only)")

    # The profile: --config names a file of the ConfigMap's volume.
    config = f.get("--config", "")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    mdir, key = os.path.dirname(config), os.path.basename(config)
    vol = vols.get(mounts.get(mdir, ""), {})
    if vol.get("configMap", {}).get("name") != cm["metadata"]["name"] or key not in cm["data"]:
        err(f"--config {config!r}: expected a key of ConfigMap {cm['metadata']['name']} "
            f"mounted at its folder")
    else:
        text = cm["data"][key]
        m = re.search(r'^profile:\s*"([^"]+)"', text, re.M)
        shipped = os.path.join(ROOT, "deploy", "configs", f"{m.group(1)}.textproto") if m else ""
        if not m or not os.path.exists(shipped) or open(shipped).read() != text:
            err(f"ConfigMap {key}: expected a shipped profile of deploy/configs, verbatim")

    # Metrics: annotations, flag and port agree.
    ann = spec["template"]["metadata"].get("annotations", {})
    mport = port_of(f.get("--metrics-listen", ":-1"))
    if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/port") != str(
            mport) or ports.get("metrics") != mport:
        err(f"metrics: expected prometheus.io annotations, --metrics-listen and the container "
            f"port metrics on one port (annotation {ann.get('prometheus.io/port')}, "
            f"flag {mport}, port {ports.get('metrics')})")

    # The device: the overlay's vendor resource, one per pod, and gpu:0.
    limits = c.get("resources", {}).get("limits", {})
    gpus = {k: v for k, v in limits.items() if k.endswith("/gpu")}
    want = OVERLAYS.get(overlay)
    if want and gpus != {want: 1}:
        err(f"resources.limits: expected {want}: 1 (one GPU per pod), got {gpus}")
    if not want and gpus:
        err(f"resources.limits: expected no GPU, got {gpus}")
    device = f.get("--device")
    if device != ("gpu:0" if want else "cpu"):
        err(f"--device={device}: expected {'gpu:0' if want else 'cpu'}")


# --------------------------------------------------------------- self-test --

def _container(objs):
    return pod_spec(next(o for o in objs if o["kind"] == "StatefulSet"))["containers"][0]


def _sts(objs):
    return next(o for o in objs if o["kind"] == "StatefulSet")


def _set_arg(objs, flag, value):
    c = _container(objs)
    c["args"] = [a for a in c["args"] if not a.startswith(flag + "=")] + [f"{flag}={value}"]


MUTATIONS = {
    "unknown field": lambda o: _container(o).update(imagePullPolicyy="Always"),
    "bad quantity": lambda o: _container(o)["resources"]["limits"].update(memory=[8]),
    "wrong type": lambda o: _sts(o)["spec"].update(replicas="two"),
    "missing required": lambda o: _sts(o)["spec"].pop("selector"),
    "unknown probe field": lambda o: _container(o)["readinessProbe"]["grpc"].update(svc="x"),
    "probe port": lambda o: _container(o)["readinessProbe"]["grpc"].update(port=50062),
    "http probe": lambda o: _container(o).update(livenessProbe={"httpGet": {"port": 9464}}),
    "grace": lambda o: pod_spec(_sts(o)).update(terminationGracePeriodSeconds=30),
    "pdb selector": lambda o: next(x for x in o if x["kind"] == "PodDisruptionBudget")[
        "spec"]["selector"]["matchLabels"].update({"app.kubernetes.io/name": "other"}),
    "root": lambda o: pod_spec(_sts(o))["securityContext"].update(runAsUser=0),
    "writable root": lambda o: _container(o)["securityContext"].update(
        readOnlyRootFilesystem=False),
    "device": lambda o: _set_arg(o, "--device", "auto"),
    "metrics port": lambda o: _set_arg(o, "--metrics-listen", "0.0.0.0:9100"),
    "profile": lambda o: next(x for x in o if x["kind"] == "ConfigMap")["data"].update(
        {"profile.textproto": 'profile: "demo"\n'}),
}


def check_overlay(name, objects):
    errors = []
    for o in objects:
        model = KINDS.get((o.get("apiVersion"), o.get("kind")))
        if not model:
            errors.append(f"{name}: {o.get('apiVersion')} {o.get('kind')}: not a kind "
                          f"this deployment uses ({sorted(KINDS.values())})")
            continue
        check_schema(o, model, f"{name}: {o['kind']}/{o['metadata'].get('name')}", errors)
    check_invariants(name, objects, errors)
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--kubectl", default=shutil.which("kubectl") or "none")
    ap.add_argument("-v", "--verbose", action="store_true")
    opts = ap.parse_args()
    problems = []

    lint = subprocess.run(["yamllint", "-s", "-c", os.path.join(HERE, ".yamllint"), HERE],
                          capture_output=True, text=True)
    if lint.returncode:
        problems.append("yamllint:\n" + lint.stdout + lint.stderr)
    # The images the overlays name: the user the manifests run as, the
    # port they probe, the health check, the install layout.
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.cuda", "Dockerfile.rocm"):
        text = open(os.path.join(ROOT, "deploy", "docker", dockerfile)).read()
        for want, why in ((f"USER {IMAGE_UID}:{IMAGE_UID}", "the manifests' runAsUser"),
                          ("EXPOSE 50061", "the manifests' grpc port"),
                          ("INDEXERD_CONFIG_DIR=/opt/indexerd/share/indexerd/configs",
                           "collect_runtime.sh's layout"),
                          ("INDEXERD_HEALTH_ADDR=127.0.0.1:50061", "the default --listen port")):
            if want not in text:
                problems.append(f"deploy/docker/{dockerfile}: expected {want} ({why})")
        if not re.search(r"^HEALTHCHECK .*\\\n\s*CMD indexer-cli .* health", text, re.M):
            problems.append(f"deploy/docker/{dockerfile}: expected a HEALTHCHECK running "
                            "indexer-cli ... health")

    for name in OVERLAYS:
        d = os.path.join(HERE, "overlays", name)
        objects = render(d)
        if opts.kubectl != "none":
            theirs = kubectl_render(opts.kubectl, d)
            if by_key(theirs) != by_key(objects):
                problems.append(f"{name}: check.py's rendering differs from `kubectl kustomize`")
        errs = check_overlay(name, objects)
        problems += errs
        print(f"{name}: {len(objects)} objects "
              f"({', '.join(sorted(o['kind'] for o in objects))}): "
              f"{'ok' if not errs else f'{len(errs)} problems'}"
              f"{', same as kubectl kustomize' if opts.kubectl != 'none' else ''}")
        if opts.verbose:
            print(yaml.safe_dump_all(objects, sort_keys=False))
        if opts.self_test and not errs:
            for what, mutate in MUTATIONS.items():
                broken = copy.deepcopy(objects)
                mutate(broken)
                found = check_overlay(name, broken)
                if not found:
                    problems.append(f"self-test {name}: '{what}' was not reported")
                elif opts.verbose:
                    print(f"  self-test '{what}': {found[0]}")
            print(f"{name}: self-test: {len(MUTATIONS)} breakages checked")
    for p in problems:
        print("FAIL:", p)
    print("k8s check:", "ok" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
