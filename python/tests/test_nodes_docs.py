"""docs/nodes.md's examples are ones riffle takes: its YAML parses, the
daemon's flags in the DaemonSet and the SLURM script are flags `riffle
serve` has, with values it accepts, and the pieces that must agree do (the
headless Service the daemons resolve, the socket the training pods name,
the secrets they read)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import yaml

from conftest import REPO, riffle_bin

DOC = REPO / "docs" / "nodes.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(), re.M | re.S)


def manifests() -> dict[str, dict]:
    out = {}
    for b in blocks("yaml"):
        for doc in yaml.safe_load_all(b):
            out[doc["kind"]] = doc
    return out


def accepts(cmd: list[str]) -> None:
    """riffle parses cmd's flags and their values (with --help it stops there, starting nothing)."""
    p = subprocess.run([riffle_bin(), *cmd, "--help"], capture_output=True, text=True)
    assert p.returncode == 0, f"riffle {' '.join(cmd)}: {p.stderr.strip()}"


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def test_kubernetes_manifests():
    m = manifests()
    assert set(m) == {"Secret", "Service", "DaemonSet", "Pod"}, set(m)
    svc, ds, pod, secret = m["Service"], m["DaemonSet"], m["Pod"], m["Secret"]
    tmpl = ds["spec"]["template"]
    daemon = next(c for c in tmpl["spec"]["containers"] if c["args"][0] == "serve")
    env = env_of(daemon)

    # $(VAR) in the args is a variable the container has; with it filled in,
    # `riffle serve` takes every flag and value.
    args = daemon["args"]
    for var in re.findall(r"\$\((\w+)\)", " ".join(args)):
        assert var in env, f"the daemon's args use $({var}), which its env does not set"
    accepts([re.sub(r"\$\(\w+\)", "10.0.0.1", a) for a in args])
    flags = dict(zip(args[1::2], args[2::2]))

    # The headless Service selects the daemons' pods and is what --peers
    # resolves, on the port --tcp listens on.
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"].items() <= tmpl["metadata"]["labels"].items()
    assert ds["spec"]["selector"]["matchLabels"].items() <= tmpl["metadata"]["labels"].items()
    port = svc["spec"]["ports"][0]["port"]
    meta = svc["metadata"]
    assert flags["--peers"] == f"dns:{meta['name']}.{meta['namespace']}.svc.cluster.local:{port}"
    assert flags["--tcp"].endswith(f":{port}")
    assert any(p["containerPort"] == port for p in daemon["ports"])
    assert tmpl["spec"]["hostNetwork"] is True
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    waiter = next(c for c in tmpl["spec"]["initContainers"] if c["name"] == "wait-for-peers")
    assert f"{meta['name']}.{meta['namespace']}.svc.cluster.local" in " ".join(waiter["command"])

    # Secrets the daemon reads are in the Secret.
    assert "RIFFLE_TOKEN" in env
    for e in env.values():
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"], ref

    # The readiness probe is a riffle command that takes its flags.
    probe = daemon["readinessProbe"]["exec"]["command"]
    assert probe[0] == "riffle"
    accepts(probe[1:])

    # The training pod names the daemon's socket, on the same hostPath,
    # mounted at the same place, as the same user.
    sock = flags["--socket"]
    train = pod["spec"]["containers"][0]
    assert env_of(train)["RIFFLE_SOCKET"]["value"] == sock

    def host_dir(spec: dict, container: dict) -> tuple[str, str]:
        mount = next(v for v in container["volumeMounts"] if sock.startswith(v["mountPath"] + "/"))
        vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        return vol["hostPath"]["path"], mount["mountPath"]

    assert host_dir(pod["spec"], train) == host_dir(tmpl["spec"], daemon)
    assert pod["spec"]["securityContext"]["runAsUser"] == daemon["securityContext"]["runAsUser"]
    # The directories the daemon keeps private are made its user's.
    init = next(c for c in tmpl["spec"]["initContainers"] if c["name"] == "private-dirs")
    made = " ".join(init["command"])
    assert f"-o {daemon['securityContext']['runAsUser']}" in made
    for d in (str(Path(sock).parent), flags["--cache-dir"]):
        assert d in made, f"{d} is not made the daemon's in the init container"


def test_slurm_script():
    (script,) = [b for b in blocks("sh") if "#SBATCH" in b]
    p = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    served = status = 0
    for sub, rest in re.findall(r"riffle (serve|status)([^'\n;>]*)", script):
        cmd = [sub, *shlex.split(rest.replace("$(hostname)", "node1"))]
        accepts(cmd)
        served += cmd[0] == "serve"
        status += cmd[0] == "status"
    assert served == 1 and status == 1, (served, status)
    # The daemons take their peers and node index from the environment.
    assert "export RIFFLE_PEERS=" in script and "export RIFFLE_TOKEN=" in script
