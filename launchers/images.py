"""`python -m launchers.images build [IMAGE|FRAMEWORK ...]`: per-framework container images.

    python -m launchers.images build                 # every image
    python -m launchers.images build torch mxnet     # the images these frameworks run in
    python -m launchers.images build pytorch --base nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 --device cuda
    python -m launchers.images list

One Dockerfile per framework environment (docker/<image>.Dockerfile). The build context is
staged by this module: the env files the image installs (envs/*.txt, the very files the local
virtualenvs are built from), the project's sources, and what pip on this machine is configured
with (its certificate bundle and the wheels of its `find-links` folders: bind-mounted during
the install step, never copied into a layer).

Caching, the way core/envs.py keys virtualenvs: an image is tagged
`localhost/dlcompare/<image>:<inputs digest>`, the digest covering the Dockerfile, every staged
file, the pip configuration and the staged wheels' names and sizes, the base image's id and the build arguments. An image
whose tag exists is reused without running the engine's build at all; a changed input builds a
new tag, reusing the engine's layer cache for the unchanged steps (editing the project's sources
rebuilds only the last layer), and the image's older tags are removed.

Without --base the images build on `localhost/dlcompare/debian:<codename>`, made here once with
debootstrap (minbase) from the Debian mirror this machine's apt is configured with: there may be
no registry to pull a base from. The engine is docker when its daemon answers, else podman
(installed with apt when missing, as root), see launchers/engine.py.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from adapters.registry import FRAMEWORKS, FrameworkInfo
from core.cli import OneLineParser, fail
from core.envs import (REPO_ROOT, EnvBuildError, build_helper_files, build_requirements_file,
                       dlcompare_home, ensure_apt_packages, nodeps_requirements_file,
                       reexec_in_host_env, requirements_dir, requirements_file)
from launchers.engine import Engine, EngineError, find_engine

DOCKER_DIR = REPO_ROOT / "docker"
PROJECT_PARTS = ("core", "models", "analysis", "adapters", "launchers", "pyproject.toml")
IMAGE_PREFIX = "localhost/dlcompare"
INPUTS_LABEL = "org.dlcompare.inputs"
BASE_APT = ["debootstrap"]


@dataclass(frozen=True)
class ImageSpec:
    """One framework image: its Dockerfile and the environments (envs/<name>.txt) it holds,
    installed in this order into one virtualenv at /opt/venv."""

    name: str
    installs: tuple[str, ...]
    python: str = "/opt/venv/bin/python"

    @property
    def dockerfile(self) -> Path:
        return DOCKER_DIR / f"{self.name}.Dockerfile"

    @property
    def repository(self) -> str:
        return f"{IMAGE_PREFIX}/{self.name}"


IMAGES: dict[str, ImageSpec] = {
    "pytorch": ImageSpec("pytorch", ("torch-mpi", "horovod")),
    "tensorflow": ImageSpec("tensorflow", ("tf",)),
    "mxnet": ImageSpec("mxnet", ("mxnet",)),
}


@dataclass(frozen=True)
class BuiltImage:
    """A framework image present in the engine's storage."""

    spec: ImageSpec
    tag: str
    id: str  # sha256:... of the image configuration (the digest records carry)
    size: int
    built_s: float | None  # seconds this call spent building; None: reused from the cache


class ImageError(EngineError):
    """An image cannot be named, staged or built; the message is one line."""


# --------------------------------------------------------------------------- naming

def image_for(info: FrameworkInfo) -> ImageSpec | None:
    """The image that holds a framework's environment (its `image` in the registry), None
    where it has none."""
    return IMAGES[info.image] if info.image else None


def resolve_images(names: list[str]) -> list[ImageSpec]:
    """Image names or framework CLI names (torch, tf, ...) to images; none given: all."""
    if not names:
        return list(IMAGES.values())
    found: dict[str, ImageSpec] = {}
    for name in names:
        if name in IMAGES:
            found[name] = IMAGES[name]
        elif name in FRAMEWORKS:
            spec = image_for(FRAMEWORKS[name])
            if spec is None:
                raise ImageError(f"framework {name!r} has no container image yet "
                                 f"(images: {', '.join(IMAGES)})")
            found[spec.name] = spec
        else:
            raise ImageError(f"unknown image or framework {name!r} (images: "
                             f"{', '.join(IMAGES)}; frameworks: {', '.join(FRAMEWORKS)})")
    return list(found.values())


# --------------------------------------------------------------------------- build context

def env_files(name: str) -> list[Path]:
    """Every file environment `name` is built from: its requirement file and those it
    includes with -r, its --no-deps and build files, and the build's helper scripts."""
    files, pending = [], [requirements_file(name)]
    while pending:
        path = pending.pop()
        if path in files:
            continue
        files.append(path)
        pending += [path.parent / included for included in
                    re.findall(r"^-r\s+(\S+)\s*$", path.read_text(), re.MULTILINE)]
    for extra in (nodeps_requirements_file(name), build_requirements_file(name)):
        if extra is not None:
            files.append(extra)
            if extra == build_requirements_file(name):
                files += build_helper_files(extra.read_text())
    return files


def project_files() -> list[Path]:
    """The project's sources that go into every image (no tests, no caches)."""
    files = []
    for part in PROJECT_PARTS:
        path = REPO_ROOT / part
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        files += [p for p in candidates if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix not in (".pyc", ".log")]
    return files


def host_pip_settings() -> dict[str, list[str]]:
    """pip's settings on this machine (its configuration files and PIP_* variables), as
    {key: [values]} for the keys an image build needs: find-links, cert, default-timeout."""
    result = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True)
    settings: dict[str, list[str]] = {}
    for key, value in re.findall(r"^[^=]*\.([a-z-]+)='(.*)'$", result.stdout, re.MULTILINE):
        settings.setdefault(key, []).append(value)
    for key in ("find-links", "cert", "default-timeout"):
        value = os.environ.get("PIP_" + key.upper().replace("-", "_"))
        if value:
            settings.setdefault(key, []).append(value)
    return settings


def stage_pip(context: Path, device: str) -> list[str]:
    """Stage `pip/` in the build context, bind-mounted (never copied into a layer) while the
    image installs its environments: a pip.conf, the machine's pip certificate bundle (a
    TLS-inspecting proxy's CA, say, without which PyPI cannot be reached from inside) and the
    wheels of its `find-links` folders (the CPU torch wheel, say); pip falls back to PyPI for
    the rest. Wheels are hard-linked where possible, and staged for CPU images only: a local
    CPU wheel must not stand in for a CUDA build. Returns the lines for the inputs digest."""
    settings = host_pip_settings()
    folder = context / "pip"
    (folder / "wheels").mkdir(parents=True)
    conf = ["[global]", "find-links = /pip/wheels", "no-cache-dir = true",
            "disable-pip-version-check = true"]
    lines = []
    certs = [Path(value) for value in settings.get("cert", []) if Path(value).is_file()]
    if certs:
        shutil.copyfile(certs[-1], folder / "ca.crt")
        conf.append("cert = /pip/ca.crt")
        lines.append(f"pip/ca.crt {sha256_file(certs[-1])}")
    if settings.get("default-timeout"):
        conf.append(f"timeout = {settings['default-timeout'][-1]}")
    wheel_dirs = {Path(item.removeprefix("file://")) for value in settings.get("find-links", [])
                  for item in value.split()}
    for wheel_dir in sorted(filter(Path.is_dir, wheel_dirs)) if device == "cpu" else []:
        for wheel in sorted(wheel_dir.glob("*.whl")):
            link_or_copy(wheel, folder / "wheels" / wheel.name)
            lines.append(f"pip/wheels/{wheel.name} {wheel.stat().st_size}")
    (folder / "pip.conf").write_text("\n".join(conf) + "\n")
    return [*lines, f"pip/pip.conf {sha256_file(folder / 'pip.conf')}"]


def stage_context(spec: ImageSpec, device: str) -> tuple[Path, list[str]]:
    """Write the build context of `spec`: Dockerfile, envs/ (the files of the environments it
    installs), project/ (the sources), pip/ (see stage_pip); return it and the lines its
    inputs digest is made of."""
    context = dlcompare_home() / "containers" / "context" / spec.name
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    digest_lines = [f"Dockerfile {sha256_file(spec.dockerfile)}"]
    shutil.copy2(spec.dockerfile, context / "Dockerfile")
    staged: dict[Path, Path] = {}
    for name in spec.installs:
        for path in env_files(name):
            staged[context / "envs" / path.relative_to(requirements_dir())] = path
    for path in project_files():
        staged[context / "project" / path.relative_to(REPO_ROOT)] = path
    for target, source in sorted(staged.items()):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        digest_lines.append(f"{target.relative_to(context)} {sha256_file(source)}")
    return context, digest_lines + stage_pip(context, device)


def link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- base image

def host_codename() -> str:
    text = Path("/etc/os-release").read_text() if Path("/etc/os-release").exists() else ""
    match = re.search(r"^VERSION_CODENAME=(\w+)", text, re.MULTILINE)
    return match.group(1) if match else "bookworm"


def debian_mirror(codename: str) -> str:
    """The Debian mirror this machine's apt uses for `codename` (sources.list, .list files
    and deb822 .sources files); deb.debian.org when none is configured."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in filter(Path.is_file, sources):
        text = path.read_text(errors="replace")
        for stanza in re.split(r"\n\s*\n", text):  # deb822: URIs + Suites in one stanza
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.MULTILINE)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.MULTILINE)
            if uris and suites and codename in suites.group(1).split():
                return uris.group(1)
        for uri, suite in re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", text,
                                     re.MULTILINE):
            if suite == codename:
                return uri
    return "http://deb.debian.org/debian"


def default_base() -> str:
    return f"{IMAGE_PREFIX}/debian:{host_codename()}"


def ensure_base_image(engine: Engine, base: str, log) -> str:
    """The base image's id; the project's Debian base is made with debootstrap if missing.
    Any other base must already be local (podman never pulls) or pullable (docker)."""
    if engine.image_exists(base):
        return engine.image_facts(base)["id"]
    if base != default_base():
        if engine.name == "docker":
            engine.run("pull", base, capture=False, timeout=None)
            return engine.image_facts(base)["id"]
        raise ImageError(f"base image {base} is not in {engine.name}'s storage (nothing is "
                         f"pulled: load it first, or leave out --base)")
    if os.geteuid() != 0:
        raise ImageError(f"making the base image {base} with debootstrap needs root; run as "
                         f"root once, or give --base IMAGE")
    try:
        ensure_apt_packages(BASE_APT, log)
    except EnvBuildError as error:
        raise ImageError(str(error)) from None
    codename = base.rsplit(":", 1)[1]
    mirror = debian_mirror(codename)
    rootfs = dlcompare_home() / "containers" / f"rootfs-{codename}"
    shutil.rmtree(rootfs, ignore_errors=True)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    log(f"making base image {base}: debootstrap --variant=minbase {codename} from {mirror}")
    log_path = rootfs.parent / f"debootstrap-{codename}.log"
    with open(log_path, "w") as out:
        done = subprocess.run(["debootstrap", "--variant=minbase", codename, str(rootfs), mirror],
                              stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        shutil.rmtree(rootfs, ignore_errors=True)
        raise ImageError(f"debootstrap {codename} from {mirror} failed: "
                         f"{last_line(log_path)} (full log: {log_path})")
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for item in (rootfs / leftover).glob("*"):
            if item.is_file():
                item.unlink()
    import_rootfs(engine, rootfs, base, mirror)
    shutil.rmtree(rootfs, ignore_errors=True)
    return engine.image_facts(base)["id"]


def import_rootfs(engine: Engine, rootfs: Path, name: str, mirror: str) -> None:
    """Stream the root file system as a tar archive into `engine import`."""
    process = subprocess.Popen(
        engine.command("import", "--change", 'CMD ["/bin/bash"]',
                       "--change", f"LABEL org.dlcompare.mirror={mirror}", "-", name),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=engine.process_env())
    with tarfile.open(fileobj=process.stdin, mode="w|") as archive:
        archive.add(rootfs, arcname=".")
    process.stdin.close()
    stderr = process.stderr.read().decode(errors="replace")
    if process.wait() != 0:
        raise ImageError(f"{engine.name} import of {name} failed: "
                         f"{(stderr.strip().splitlines() or ['no output'])[-1]}")


def last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


# --------------------------------------------------------------------------- framework images

def ensure_image(engine: Engine, spec: ImageSpec, base: str | None = None,
                 device: str = "cpu", log=print, status=None) -> BuiltImage:
    """The image `spec`, built now if no image with its inputs' digest exists.

    `status(text)` is called with the build's current step (for a progress line)."""
    base = base or default_base()
    base_id = ensure_base_image(engine, base, log)
    context, lines = stage_context(spec, device)
    build_args = {"BASE": base, "DEVICE": device}
    lines += [f"base {base_id}", *(f"arg {k}={v}" for k, v in sorted(build_args.items()))]
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    tag = f"{spec.repository}:{digest[:16]}"
    if engine.image_exists(tag):
        facts = engine.image_facts(tag)
        return BuiltImage(spec, tag, facts["id"], facts["size"], None)
    log(f"building image {tag} with {engine.name} (once for these inputs; later runs reuse it)")
    started = time.monotonic()
    log_path = context.parent.parent / "logs" / f"{spec.name}-{digest[:16]}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = ["build", *engine.pull_flag(), "--force-rm", "--network", "host", "--file",
               str(context / "Dockerfile"), "--tag", tag, "--label", f"{INPUTS_LABEL}={digest}",
               *(f"--build-arg={k}={v}" for k, v in build_args.items()), str(context)]
    if not run_logged(engine, command, log_path, status):
        raise ImageError(f"building image {spec.name} failed: {build_error(log_path)} "
                         f"(full log: {log_path})")
    remove_older_tags(engine, spec, tag)
    facts = engine.image_facts(tag)
    return BuiltImage(spec, tag, facts["id"], facts["size"], time.monotonic() - started)


def run_logged(engine: Engine, command: list[str], log_path: Path, status) -> bool:
    """Run an engine command, its output into `log_path`, each build step to `status`."""
    env = engine.process_env()
    if engine.name == "docker":
        env.setdefault("DOCKER_BUILDKIT", "1")  # RUN --mount needs BuildKit
    with open(log_path, "w") as out:
        process = subprocess.Popen(engine.command(*command), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, env=env)
        for line in process.stdout:
            out.write(line)
            out.flush()  # the log is where a slow build is watched
            step = re.match(r"^(STEP \d+/\d+: .{0,90}|#\d+ \[[^\]]+\] .{0,90})", line)
            if step and status:
                status(step.group(1))
        return process.wait() == 0


def build_error(log_path: Path) -> str:
    """The line of a failed build's log that says why: pip's or apt's or the project's own
    error before the engine's generic "building at STEP ..."."""
    lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines()
             if line.strip()]
    for prefixes in (("ERROR:", "E: "), ("dlcompare: error",), ("Error", "error:")):
        for line in reversed(lines):
            if line.startswith(prefixes):
                return line[:300]
    return lines[-1][:300] if lines else "no output"


def remove_older_tags(engine: Engine, spec: ImageSpec, keep: str) -> None:
    """Older digests of the same image are stale: untag them (shared layers stay)."""
    listed = engine.run("images", "--format", "{{.Repository}}:{{.Tag}}", spec.repository,
                        check=False).stdout.split()
    stale = [name for name in listed if name != keep and name.startswith(spec.repository + ":")]
    if stale:
        engine.run("rmi", *stale, check=False)


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m launchers.images",
                           description="Build the per-framework container images (cached by "
                                       "the digest of their inputs).")
    sub = parser.add_subparsers(dest="action", required=True)
    build = sub.add_parser("build", help="build (or reuse) images")
    build.add_argument("names", nargs="*", metavar="IMAGE|FRAMEWORK",
                       help=f"images ({', '.join(IMAGES)}) or frameworks (torch, tf, ...); "
                            f"default: all")
    build.add_argument("--base", default=None,
                       help="base image (default: the Debian base made with debootstrap); "
                            "e.g. nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 with --device cuda")
    build.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="framework builds to install (default: %(default)s)")
    sub.add_parser("list", help="list the framework images present")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    reexec_in_host_env("launchers.images", argv)
    from rich.console import Console  # after the re-exec: rich is in the host environment

    console = Console(stderr=True)
    try:
        specs = resolve_images(getattr(args, "names", []))
        engine = find_engine(log=console.print)
        if args.action == "list":
            return list_images(engine, console)
        for spec in specs:
            with console.status(f"image {spec.name} ...") as status:
                image = ensure_image(engine, spec, args.base, args.device, log=console.print,
                                     status=lambda text: status.update(f"{spec.name}: {text}"))
            how = ("reused (inputs unchanged)" if image.built_s is None
                   else f"built in {image.built_s:.0f} s")
            console.print(f"{image.tag}  {image.id[:19]}  {image.size / 2**20:.0f} MiB  {how}")
    except EnvBuildError as error:  # EngineError and ImageError too
        return fail(error)
    except KeyboardInterrupt:
        print("dlcompare: interrupted", file=sys.stderr)
        return 130
    return 0


def list_images(engine: Engine, console) -> int:
    for spec in IMAGES.values():
        names = engine.run("images", "--format", "{{.Repository}}:{{.Tag}}", spec.repository,
                           check=False).stdout.split()
        for name in names:
            facts = engine.image_facts(name)
            console.print(f"{name}  {facts['id'][:19]}  {facts['size'] / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
