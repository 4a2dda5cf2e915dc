"""Wiring (issue 38 §1): the pieces of a generated repository checked against each other.

Every other validator looks at one kind of file (the Terraform parses, the workflow lints,
the tests pass), so a repository can pass them all and still not deploy: a README that
passes a variable the root module does not declare, a Lambda function whose package
nothing builds, a task definition running an image nothing pushes, a service that reads
``DATA_URI`` from an environment nobody sets, an alarm on a metric nothing emits, a Glue
job whose script is not in the repository. :func:`check_wiring` reads the tree (Terraform
with python-hcl2, the CI workflows with PyYAML, Dockerfiles, the README's shell blocks and
the Python code with :mod:`ast`) and returns one :class:`Finding` per broken joint, each
naming the file and what is wrong. Pure: no I/O, the same tree always gets the same
findings.

The rules (:data:`RULES`):

``variables``
    every variable a README or CI command passes to Terraform (``-var``, ``-var-file``,
    ``TF_VAR_*``) is declared by the root module the command runs in; every input a
    ``module`` block passes is declared by that module; every variable of a module
    without a default is passed; every root variable without a default is given to each
    command that plans or applies that root (not ``apply`` of a saved plan), or set by a
    tfvars file Terraform loads itself.
``lambda``
    every Lambda handler names a module file and a function that exist in the package,
    and the package is built from the repository (an ``archive_file`` data source, or a
    CI step that uploads the key the function reads), never a zip nothing makes.
``images``
    every image a task definition, SageMaker model or job (or a Lambda image) runs comes
    from an ECR repository the Terraform declares, is built by a CI workflow and pushed
    to that repository, under the repository's name and the tag variable the Terraform
    runs (the root variable ``image_tag`` is the CI's ``IMAGE_TAG`` or
    ``TF_VAR_image_tag``). Images AWS builds (``aws_sagemaker_prebuilt_ecr_image``) are
    accepted as they are. Every ECR repository CI pushes to is declared and run, and every
    image a CI step builds is used: pushed, run by a runtime or a compose service, or run
    by CI after the build (``docker run``: an image built to be tested). A package an
    image pins is the version the requirements pin; a batch transform sends and asks for
    MIME types its model's code names (:mod:`.content`).
``environment``
    every environment variable the code a runtime starts reads (``os.environ[...]``,
    ``os.environ.get``, ``os.getenv``, a name bound to ``os.environ``, fields of a
    pydantic ``BaseSettings``) is set by that runtime (task definition environment,
    Lambda environment, SageMaker ``Environment``, a compose file, the image's ``ENV``)
    unless its default works deployed (see :func:`default_works_deployed`); a read with
    the default ``None`` is still required where the code raises naming it. A script job
    (a Glue job, an EMR Serverless job run: :mod:`.scripts`) gets only what its script
    sets from the arguments the job passes, and every argument the script reads without
    checking it is there is passed.
``permissions``
    every AWS call of :data:`~keel.design.wiring.permissions.AWS_CALLS` (Bedrock's
    Converse and InvokeModel) that the code a Lambda function, task or script job starts
    makes is an action a policy of its module grants the runtime's role.
``alarms``
    every CloudWatch alarm watches a metric something emits: an AWS namespace of a
    resource type the Terraform creates, a log metric filter on a log group some runtime
    writes to, or a custom metric the repository's code puts (same namespace, name and
    dimensions), code that a runtime of the Terraform runs (an EventBridge Scheduler ECS
    target overriding its task's command is a runtime: the drift check's schedule).
``jobs``
    every Glue job script (and ``--extra-py-files``) and EMR entry point is an object the
    Terraform uploads from a file of the repository; every EMR Serverless application has
    a job run submitted to it (a schedule or state machine calling ``StartJobRun``); a
    Glue job's ``glue_version`` runs a Python the repository's ``requires-python`` allows,
    and it installs the pinned ``requirements.txt`` (``--additional-python-modules``).
``account``
    no account-wide singleton (Lake Formation settings, AWS Config's recorder and delivery
    channel, Macie, the Glue catalog's encryption, GuardDuty, ...) unless the root module
    owns the account's baseline (``locals { account_baseline = true }``, issue 38 §3).
``kafka``
    every client of an MSK cluster (Python Kafka settings, the bootstrap broker list the
    Terraform hands out, a Lambda event source mapping) authenticates in a mode the
    cluster admits, and every topic a mapping reads is created (a ``kafka_topic`` or a
    bootstrap ``aws_lambda_invocation`` the mapping waits for).
``objects``
    every model archive the Terraform hands a runtime by URL (``ModelDataUrl``,
    ``model_data_url``, ``MODEL_DATA_URL``) has a writer: code a runtime runs that writes
    the key under the ``DATA_URI`` it is given, or an ``aws_s3_object`` or Step Functions
    S3 state of the Terraform; and the runtimes of one region that run pipeline steps
    (``DATA_URI``, a script job's ``--data_uri``) share one store (:mod:`.stores`).

The package: the parsers (:mod:`.model` for the shapes, :mod:`.terraform`,
:mod:`.commands` for shell and README blocks, :mod:`.ci`, :mod:`.code` for Python and
Dockerfiles), :mod:`.repo` for the tree parsed once, and one module per rule.
"""

from __future__ import annotations

from collections.abc import Mapping

from keel.design.wiring.account import ACCOUNT_SINGLETONS, check_account
from keel.design.wiring.alarms import check_alarms
from keel.design.wiring.code import code_metrics, default_works_deployed, env_reads, import_closure
from keel.design.wiring.content import check_content_types
from keel.design.wiring.emr import check_emr_python
from keel.design.wiring.environment import check_environment
from keel.design.wiring.images import check_images
from keel.design.wiring.jobs import check_jobs
from keel.design.wiring.kafka import check_kafka
from keel.design.wiring.lambdas import check_lambdas
from keel.design.wiring.model import AWS_NAMESPACES, RULES, RUNTIME_PROVIDED, Finding
from keel.design.wiring.objects import check_objects
from keel.design.wiring.permissions import AWS_CALLS, check_permissions
from keel.design.wiring.repo import Repo
from keel.design.wiring.scripts import check_applications, check_job_python
from keel.design.wiring.stores import check_stores
from keel.design.wiring.variables import check_variables


def check_wiring(files: Mapping[str, str]) -> list[Finding]:
    """Every rule's findings on ``files``, sorted (rule, file, message)."""
    repo = Repo.parse(files)
    found = [
        *check_variables(repo),
        *check_lambdas(repo),
        *check_images(repo),
        *check_content_types(repo),
        *check_environment(repo),
        *check_permissions(repo),
        *check_alarms(repo),
        *check_jobs(repo),
        *check_applications(repo),
        *check_job_python(repo),
        *check_emr_python(repo),
        *check_account(repo),
        *check_kafka(repo),
        *check_objects(repo),
        *check_stores(repo),
    ]
    return sorted(set(found), key=lambda f: (RULES.index(f.rule), f.file, f.message))


__all__ = [
    "ACCOUNT_SINGLETONS",
    "AWS_CALLS",
    "AWS_NAMESPACES",
    "RULES",
    "RUNTIME_PROVIDED",
    "Finding",
    "check_wiring",
    "code_metrics",
    "default_works_deployed",
    "env_reads",
    "import_closure",
]
