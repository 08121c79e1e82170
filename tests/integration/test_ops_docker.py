"""The Dockerfile and .dockerignore: checked statically on every run; built with
podman or docker only where a base image is already present locally."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.support.dockerfile import (
    DOCKERFILE,
    ROOT,
    Dockerfile,
    all_copy_sources,
    arg_default,
    context_files,
    exec_form,
    ignored,
    parse_dockerfile,
    read_dockerignore,
)

STATEFULSET = ROOT / "ops" / "k8s" / "statefulset.yaml"
IMAGE_TAG = "localhost/phalanx:test"


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def k8s_container() -> dict[str, object]:
    sts = yaml.safe_load(STATEFULSET.read_text())
    containers: list[dict[str, object]] = sts["spec"]["template"]["spec"]["containers"]
    return containers[0]


def k8s_security_context() -> dict[str, int]:
    sts = yaml.safe_load(STATEFULSET.read_text())
    context: dict[str, int] = sts["spec"]["template"]["spec"]["securityContext"]
    return context


# --------------------------------------------------------------------------- static checks


def test_dockerignore_matching_follows_docker_rules() -> None:
    patterns = ["*", "!daemon/", "**/__pycache__", "**/*.py[cod]"]
    assert ignored(".venv/bin/python", patterns)
    assert ignored("tests/unit/test_x.py", patterns)
    assert not ignored("daemon/cli.py", patterns)
    assert ignored("daemon/__pycache__/cli.cpython-311.pyc", patterns)
    assert ignored("daemon/sub/x.pyo", patterns)
    assert not ignored("daemon/x.py", patterns)


def test_every_copy_source_exists_and_reaches_the_context(dockerfile: Dockerfile) -> None:
    patterns = read_dockerignore()
    sources = all_copy_sources()
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert not ignored(source.rstrip("/"), patterns), f"COPY {source} is in .dockerignore"
    files = context_files()
    for name in ("pyproject.toml", "README.md", "daemon/__init__.py", "trainer/config/sections.py"):
        assert name in files
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    # Nothing else is sent: the local .venv, .git and tests stay out of the context.
    for path in (".venv/bin/python", ".git/HEAD", "tests/__init__.py", "Makefile"):
        assert ignored(path, patterns), path


def test_copies_every_package_and_the_readme(pyproject: dict[str, object]) -> None:
    """`pip install .` in the builder needs each package pyproject.toml lists, and its readme."""
    project = pyproject["project"]
    tool = pyproject["tool"]
    assert isinstance(project, dict) and isinstance(tool, dict)
    copied = {s.rstrip("/") for s in all_copy_sources()}
    assert "pyproject.toml" in copied
    assert project["readme"] in copied
    include = tool["setuptools"]["packages"]["find"]["include"]
    tops = {p.rstrip("*").rstrip(".") for p in include}
    packages = {d.name for d in ROOT.iterdir() if (d / "__init__.py").is_file()}
    for top in tops:
        matching = {p for p in packages if p.startswith(top)}
        assert matching, f"no package matches {top}*"
        assert matching <= copied, f"packages {matching - copied} are not copied"


def test_multi_stage_with_torch_build_args(dockerfile: Dockerfile) -> None:
    assert len(dockerfile.stages) >= 2
    builder, runtime = dockerfile.stages[0], dockerfile.stages[-1]
    names = [s.name for s in dockerfile.stages]
    assert builder.name == "builder"
    args = dict(arg_default(a) for a in builder.all("ARG"))
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    makefile = (ROOT / "Makefile").read_text()
    pinned = re.search(r"^TORCH_VERSION \?= (\S+)$", makefile, re.M)
    assert pinned is not None
    assert args["TORCH_VERSION"] == pinned.group(1), "Dockerfile and Makefile pin different torch"
    runs = " ".join(builder.all("RUN"))
    assert "venv" in runs
    torch = [r for r in builder.all("RUN") if "torch==" in r]
    assert len(torch) == 1
    assert '"torch==${TORCH_VERSION}"' in torch[0] or "torch==${TORCH_VERSION}" in torch[0]
    assert '--index-url "${TORCH_INDEX_URL}"' in torch[0]
    project = [i for i, r in enumerate(builder.all("RUN")) if re.search(r"pip install \.", r)]
    assert project and builder.all("RUN").index(torch[0]) < project[0], "torch must come first"
    # The runtime stage takes the finished venv, not the sources or the build tools.
    froms = [a for a in runtime.all("COPY") if "--from" in a]
    assert froms and all(f"--from={builder.name}" in a for a in froms)
    assert not [a for a in runtime.all("COPY") if "--from" not in a]
    assert runtime.base == builder.base  # the venv's interpreter links must stay valid
    assert len(set(names)) == len(names)


def test_final_stage_runs_as_non_root_matching_kubernetes(dockerfile: Dockerfile) -> None:
    user = dockerfile.stages[-1].last("USER")
    assert user is not None, "the final stage has no USER: it would run as root"
    uid, _, gid = user.partition(":")
    assert uid.isdigit(), "use a numeric USER so runAsNonRoot can verify it"
    assert int(uid) != 0 and uid != "root" and gid not in ("0", "root")
    security = k8s_security_context()
    assert security["runAsUser"] == int(uid)
    if gid:
        assert security["runAsGroup"] == int(gid)


def test_entrypoint_is_the_console_script(
    dockerfile: Dockerfile, pyproject: dict[str, object]
) -> None:
    runtime = dockerfile.stages[-1]
    project = pyproject["project"]
    assert isinstance(project, dict)
    entrypoint = runtime.last("ENTRYPOINT")
    cmd = runtime.last("CMD")
    assert entrypoint is not None and cmd is not None
    assert exec_form(entrypoint) == ["phalanx"]
    assert exec_form(entrypoint)[0] in project["scripts"]
    assert exec_form(cmd) == ["run", "--config", "/etc/phalanx/job.toml"]
    # Kubernetes keeps the ENTRYPOINT and replaces CMD with its args.
    args = k8s_container()["args"]
    assert isinstance(args, list)
    assert args[:3] == exec_form(cmd)


def test_healthcheck_and_ports_match_kubernetes(dockerfile: Dockerfile) -> None:
    runtime = dockerfile.stages[-1]
    check = runtime.last("HEALTHCHECK")
    assert check is not None
    options, _, command = check.partition("CMD")
    assert "--interval=" in options and "--timeout=" in options
    argv = exec_form(command.strip())
    assert argv[:2] == ["python", "-c"], "slim images have no curl"
    # The daemon binds its advertised address (by default the hostname's), not loopback.
    urls = re.findall(r"http://\{socket\.gethostname\(\)\}:(\d+)(/\S*?)['\"]", argv[2])
    assert len(urls) == 1, argv[2]
    port, path = int(urls[0][0]), urls[0][1]

    container = k8s_container()
    ports = container["ports"]
    probe = container["livenessProbe"]
    assert isinstance(ports, list) and isinstance(probe, dict)
    by_name = {p["name"]: p["containerPort"] for p in ports}
    probe_port = probe["httpGet"]["port"]
    assert port == by_name.get(probe_port, probe_port) == 29520
    assert path == probe["httpGet"]["path"] == "/healthz"
    exposed = {int(p) for a in runtime.all("EXPOSE") for p in a.split()}
    assert exposed == set(by_name.values()) == {29520, 29510}


# --------------------------------------------------------------------------- build


@pytest.mark.integration
def test_context_builds_the_distribution(tmp_path: Path) -> None:
    """What `pip install .` does in the builder, from exactly the files COPY sends,
    without the network: the wheel builds and carries both packages and the script."""
    context = tmp_path / "context"
    for rel in context_files():
        target = context / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    wheel_cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    done = subprocess.run(
        [*wheel_cmd, "-q", "-w", str(tmp_path / "dist"), str(context)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("phalanx-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = zf.read(entry_points).decode()
    assert "daemon/__init__.py" in names and "trainer/config/sections.py" in names
    assert re.search(r"^phalanx = daemon\.cli:main$", scripts, re.M), scripts


def _engine_with_base_image(base: str) -> str | None:
    for engine in ("podman", "docker"):
        exe = shutil.which(engine)
        if exe is None:
            continue
        probe = subprocess.run(
            [exe, "image", "inspect", base], capture_output=True, text=True, timeout=60
        )
        if probe.returncode == 0:
            return exe
    return None


@pytest.mark.integration
@pytest.mark.timeout(1800)
def test_image_builds_and_runs_as_non_root(dockerfile: Dockerfile) -> None:
    """Slow (downloads torch): runs only where a base image is present locally.

    PHALANX_IMAGE_BUILD_FLAGS adds build flags, e.g. a reachable torch index:
    "--build-arg TORCH_INDEX_URL=https://mirror.example/whl/cpu".
    """
    base = dockerfile.global_args.get("BASE_IMAGE", dockerfile.stages[0].base)
    engine = _engine_with_base_image(base)
    if engine is None:
        pytest.skip(
            f"no podman or docker with the base image {base} available locally "
            "(no container registry is reachable to pull it); static checks above still ran"
        )
    build = [engine, "build", "-t", IMAGE_TAG, "-f", str(DOCKERFILE)]
    if Path(engine).name == "podman":
        build.append("--format=docker")  # OCI format drops HEALTHCHECK
    build += shlex.split(os.environ.get("PHALANX_IMAGE_BUILD_FLAGS", ""))
    done = subprocess.run([*build, str(ROOT)], capture_output=True, text=True, timeout=1700)
    assert done.returncode == 0, done.stderr[-4000:]

    inspect = subprocess.run(
        [engine, "image", "inspect", IMAGE_TAG], capture_output=True, text=True, timeout=60
    )
    image = json.loads(inspect.stdout)[0]
    config = image["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["phalanx"]
    assert config["Cmd"] == ["run", "--config", "/etc/phalanx/job.toml"]
    assert set(config["ExposedPorts"]) == {"29520/tcp", "29510/tcp"}
    health = config.get("Healthcheck") or image.get("Healthcheck")  # docker, podman
    assert "{socket.gethostname()}:29520/healthz" in " ".join(health["Test"])

    helptext = subprocess.run(
        [engine, "run", "--rm", IMAGE_TAG, "run", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if helptext.returncode != 0 and "OCI" in helptext.stderr:
        pytest.skip(f"built and inspected; this machine cannot run containers: {helptext.stderr}")
    assert helptext.returncode == 0, helptext.stderr
    assert "--node-id" in helptext.stdout
