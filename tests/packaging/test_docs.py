"""The docs as a reader follows them: every relative link and anchor lands somewhere, and the
Kubernetes quickstart's commands fit together and with the repository (the RaftCluster it
applies is admitted by the CRD and reads as intended, its archive is the bucket of the MinIO it
installs, with that MinIO's credentials, the image it builds and loads is the one the chart
runs by default, and every `flotilla` and `kubectl flotilla` command line parses). The
quickstart itself runs on kind, where Docker is; e2e/ runs the same steps there."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from flotilla.operator.spec import ClusterSpec

from flotilla import cli, kubectl_plugin
from tests.packaging.crdschema import CRDValidator, load_crd

REPO = Path(__file__).resolve().parents[2]
PAGES = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md", REPO / "e2e" / "README.md",
         REPO / "charts" / "flotilla" / "README.md"]
QUICKSTART = REPO / "docs" / "kubernetes-quickstart.md"


def _prose(text: str) -> str:
    """The text without code blocks and inline code, where nothing is a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings (duplicates numbered)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", re.sub(r"^```.*?^```", "", text,
                                                              flags=re.S | re.M), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path) if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(
                destination.read_text()):
            broken.append(f"{target}: no such heading in {destination.name}")
    assert not broken, broken


def test_the_anchor_rule_is_githubs() -> None:
    assert anchors("# A `b` c: d\n## A `b` c: d\n```\n# not a heading\n```\n") == {
        "a-b-c-d", "a-b-c-d-1"}


# --- the quickstart ------------------------------------------------------------------------------


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M)


def _commands(text: str) -> list[str]:
    """Each shell command of the page's sh blocks, continuation lines joined, comments and
    here-documents left out."""
    commands = []
    for block in _blocks(text):
        block = re.sub(r"<<'EOF'\n.*?^EOF$", "", block, flags=re.S | re.M)
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.extend(part.strip() for part in line.split(";") if part.strip())
    return commands


def _heredoc(text: str) -> dict[str, Any]:
    (body,) = re.findall(r"<<'EOF'\n(.*?)^EOF$", text, flags=re.S | re.M)
    return yaml.safe_load(body)


QUICK = QUICKSTART.read_text()
COMMANDS = _commands(QUICK)
MINIO = list(yaml.safe_load_all((REPO / "e2e" / "manifests" / "minio.yaml").read_text()))


def _words(command: str) -> list[str]:
    """A command's words, its shell variables given values a user's shell would give."""
    return shlex.split(command.replace('"$T"', "2026-01-05T17:00:00Z")
                       .replace('"$PWD', '"/src'))


def test_the_quickstart_has_every_step() -> None:
    firsts = [" ".join(shlex.split(c)[:3]) for c in COMMANDS]
    for step in ("make setup", "kind create cluster", "docker build -t",
                 "kind load docker-image", "helm install flotilla", "kubectl apply -f",
                 "kubectl scale raft/demo", "kubectl flotilla snapshot",
                 "kubectl flotilla restore", "kind delete cluster"):
        assert any(first.startswith(step) for first in firsts), step


def test_the_image_built_is_loaded_into_kind_and_is_what_the_chart_runs() -> None:
    built = next(_words(c)[3] for c in COMMANDS if c.startswith("docker build -t"))
    load = next(_words(c) for c in COMMANDS if c.startswith("kind load docker-image"))
    cluster = next(_words(c) for c in COMMANDS if c.startswith("kind create cluster"))
    assert load[3] == built
    assert load[load.index("--name") + 1] == cluster[cluster.index("--name") + 1]
    chart = yaml.safe_load((REPO / "charts" / "flotilla" / "Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "charts" / "flotilla" / "values.yaml").read_text())
    default = f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}"
    assert built == default, "the quickstart's image must be the chart's default image"
    assert values["image"]["pullPolicy"] == "IfNotPresent", "a loaded image must not be pulled"


def test_the_raft_cluster_is_admitted_and_archives_to_the_minio_it_installs() -> None:
    manifest = _heredoc(QUICK)
    stored, errors = CRDValidator(load_crd(REPO / "crds" / "raftcluster.yaml"),
                                  "v1alpha1").admit(manifest)
    assert not errors, errors
    spec = ClusterSpec.from_body({**stored, "metadata": {**stored["metadata"],
                                                         "namespace": "default",
                                                         "uid": "0f1e2d3c-aaaa"}})
    assert spec.name == "demo" and spec.replicas == 3
    assert "kubectl apply -f e2e/manifests/minio.yaml" in COMMANDS
    bucket_job = next(d for d in MINIO if d["kind"] == "Job")
    script = bucket_job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    made = re.search(r"mc mb (?:--\S+ )*e2e/([\w.-]+)", script)
    assert made and spec.archive.url.startswith(f"s3://{made.group(1)}/")
    service = next(d for d in MINIO if d["kind"] == "Service")
    port = service["spec"]["ports"][0]["port"]
    assert spec.archive.endpoint == (f"http://{service['metadata']['name']}."
                                     f"{service['metadata']['namespace']}.svc:{port}")
    root = next(d for d in MINIO if d["kind"] == "Secret")["stringData"]
    secret = next(_words(c) for c in COMMANDS if c.startswith("kubectl create secret generic"))
    assert secret[4] == manifest["spec"]["archive"]["credentialsSecret"]["name"]
    assert f"--from-literal=AWS_ACCESS_KEY_ID={root['MINIO_ROOT_USER']}" in secret
    assert f"--from-literal=AWS_SECRET_ACCESS_KEY={root['MINIO_ROOT_PASSWORD']}" in secret


def test_every_flotilla_command_line_parses() -> None:
    plugin = [_words(c)[2:] for c in COMMANDS if c.startswith("kubectl flotilla ")]
    assert len(plugin) >= 4
    parser = kubectl_plugin.build_parser()
    for argv in plugin:
        args = parser.parse_args(argv)
        assert hasattr(args, "run"), argv
    ours = [_words(c)[1:] for c in COMMANDS if c.startswith("flotilla ")]
    assert len(ours) >= 3
    parser = cli.build_parser()
    for argv in ours:
        assert hasattr(parser.parse_args(argv), "run"), argv


def test_the_files_it_names_exist() -> None:
    for path in re.findall(r"(?:-f |docker build -t \S+ )(\S+)", QUICK):
        if path not in ("-", "."):
            assert (REPO / path).exists(), path
    assert (REPO / "Dockerfile").is_file() and (REPO / "charts" / "flotilla").is_dir()
