"""Rule ``jobs``, EMR Serverless job runs: the repository's code runs on a Python it
supports, with the repository's pins.

An EMR release's own Python is older than the generated code's (EMR 7: Amazon Linux
2023's 3.9; EMR 6: 3.7) and has none of ``requirements.txt``. An application brings its
own with a custom image (``image_configuration``): a Dockerfile built on that release's
EMR Serverless base (``public.ecr.aws/emr-serverless/spark/<release>``; EMR Serverless
runs an image only on the release it was built from) that makes an interpreter and
installs the pins into it, and a job run that points Spark at it
(``spark.emr-serverless.driverEnv.PYSPARK_PYTHON`` for the driver, where the entry point
runs, and ``spark.executorEnv.PYSPARK_PYTHON`` for the executors). The image's build and
push are the ``images`` rule's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from keel.design.wiring.commands import logical_lines
from keel.design.wiring.images import application_image, dockerfile_of
from keel.design.wiring.model import Block, Finding, TfModule
from keel.design.wiring.repo import Repo
from keel.design.wiring.scripts import JobRun, job_runs, required_python
from keel.design.wiring.terraform import _all_text, _json_values

#: The Python of each EMR major release's own image (Amazon EMR release notes).
EMR_PYTHON: Mapping[str, tuple[int, int]] = {"7": (3, 9), "6": (3, 7), "5": (2, 7)}
_RELEASE = re.compile(r"^emr-(\d+)\.\d+\.\d+$")
_BASE = re.compile(r"public\.ecr\.aws/emr-serverless/spark/(emr-[\d.]+\d)")
_PYSPARK = re.compile(r"spark\.(emr-serverless\.driverEnv|executorEnv)\.PYSPARK_PYTHON=([^\s\"]+)")
#: ``--python 3.11.9``, ``python3.11``, ``python:3.11``: a Python version a RUN names.
_NAMES_VERSION = re.compile(r"(?:--python[ =]|python:?)(\d)\.(\d+)")
_SETTINGS = {
    "emr-serverless.driverEnv": "the driver (where the entry point runs)",
    "executorEnv": "the executors",
}


def _applications(repo: Repo) -> dict[str, tuple[TfModule, Block]]:
    return {
        f"aws_emrserverless_application.{app.name}.": (mod, app)
        for mod in repo.modules.values()
        for app in mod.of_kind("aws_emrserverless_application")
    }


def interpreter_python(dockerfile: str, path: str) -> tuple[int, int] | None:
    """The Python version of the interpreter at ``path`` as the Dockerfile makes it: the
    RUN that creates its environment names the version (``uv venv --python 3.11.9
    /opt/venv``, ``python3.11 -m venv /opt/venv`` for ``/opt/venv/bin/python``), or the
    path names it (``/usr/bin/python3.11``) and a RUN installs that Python. None: the
    Dockerfile makes no such interpreter."""
    root = path.split("/bin/", 1)[0] if "/bin/" in path else path
    named = re.search(r"python(\d)\.(\d+)$", path)
    for line in logical_lines(dockerfile):
        word, _, rest = line.strip().partition(" ")
        if word.upper() != "RUN":
            continue
        if named is not None and f"python{named.group(1)}.{named.group(2)}" in rest:
            return int(named.group(1)), int(named.group(2))
        if root != path and re.search(rf"(?<![\w/]){re.escape(root)}(?![\w/])", rest):
            m = _NAMES_VERSION.search(rest)
            if m is not None and "venv" in rest:
                return int(m.group(1)), int(m.group(2))
    return None


def installs_requirements(dockerfile: str, path: str) -> bool:
    """Whether a RUN installs ``requirements.txt`` (``-r``) with the interpreter at
    ``path`` (naming it or its environment: ``uv pip install --python /opt/venv/bin/python
    -r ...``, ``/opt/venv/bin/pip install -r ...``, ``python3.11 -m pip install -r ...``)."""
    root = path.split("/bin/", 1)[0] if "/bin/" in path else path
    for line in logical_lines(dockerfile):
        word, _, rest = line.strip().partition(" ")
        if word.upper() != "RUN" or "requirements.txt" not in rest:
            continue
        if not re.search(r"\bpip\b.*\s-r\s", rest):
            continue
        if root in rest or path.rsplit("/", 1)[-1] in rest.split():
            return True
    return False


def _settings(run: JobRun) -> dict[str, str]:
    """The job run's PYSPARK_PYTHON settings (driver, executors) -> interpreter path."""
    text = _all_text(run.block.body)
    params = " ".join(v for _, v in _json_values(text, ["SparkSubmitParameters"]))
    return {m.group(1): m.group(2) for m in _PYSPARK.finditer(params)}


def check_emr_python(repo: Repo) -> list[Finding]:
    need = required_python(repo)
    if need is None:
        return []
    want = f"Python >= {need[0]}.{need[1]} (pyproject.toml requires-python)"
    apps = _applications(repo)
    out: list[Finding] = []
    for run in job_runs(repo):
        if run.kind != "emr":
            continue
        found = next(((m, a) for ref, (m, a) in apps.items() if ref in run.application), None)
        if found is None:
            continue  # check_applications: the run names no application of the Terraform
        mod, app = found
        where = f"aws_emrserverless_application.{app.name}"
        script = run.script or run.script_uri
        release = str(app.body.get("release_label", "")).strip('"')
        image = application_image(app)
        if image is None:
            m = _RELEASE.match(release)
            python = EMR_PYTHON.get(m.group(1)) if m else None
            if python is None or python < need:
                has = "an unknown Python" if python is None else f"Python {python[0]}.{python[1]}"
                out.append(
                    Finding(
                        "jobs",
                        app.file,
                        f"{where} runs release {release or '(none)'}'s own {has} (it has no "
                        f"image_configuration), and {script}, which {run.where} runs on it, "
                        f"needs {want}: give the application an image that brings it",
                    )
                )
            continue
        dockerfile = dockerfile_of(repo, mod, image)
        if dockerfile is None:
            continue  # the images rule: nothing builds it
        text = repo.files[dockerfile]
        base = next((_BASE.search(line) for line in logical_lines(text) if "FROM" in line), None)
        if base is None or base.group(1) != release:
            built_on = (
                f"builds on {base.group(1)}"
                if base
                else "is not built on an EMR Serverless base image"
            )
            out.append(
                Finding(
                    "jobs",
                    dockerfile,
                    f"{dockerfile} {built_on}, but {where} (its image_configuration) runs "
                    f"release {release}: EMR Serverless runs an image only on the release "
                    f"it was built from (public.ecr.aws/emr-serverless/spark/{release})",
                )
            )
        settings = _settings(run)
        for key, who in _SETTINGS.items():
            path = settings.get(key)
            if path is None:
                out.append(
                    Finding(
                        "jobs",
                        run.block.file,
                        f"{run.where}: its job run does not set spark.{key}.PYSPARK_PYTHON "
                        f"(SparkSubmitParameters): {who} would use the release's own Python, "
                        f"not {dockerfile}'s",
                    )
                )
                continue
            python = interpreter_python(text, path)
            if python is None or python < need:
                makes = (
                    f"which {dockerfile} does not make"
                    if python is None
                    else f"Python {python[0]}.{python[1]} in {dockerfile}"
                )
                out.append(
                    Finding(
                        "jobs",
                        run.block.file,
                        f"{run.where}: spark.{key}.PYSPARK_PYTHON is {path}, {makes}; "
                        f"{script} needs {want}",
                    )
                )
            elif not installs_requirements(text, path):
                out.append(
                    Finding(
                        "jobs",
                        dockerfile,
                        f"{dockerfile} does not install requirements.txt with {path} (the "
                        f"PYSPARK_PYTHON of {run.where}): {script} would import none of the "
                        "repository's pins",
                    )
                )
    return out
