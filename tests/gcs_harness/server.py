"""A real GCS endpoint on loopback for tests of gs:// paths (pytest plugin).

Load it with ``pytest_plugins = ["gcs_harness.server"]`` in ``tests/conftest.py``.

There is no Google Cloud here, so every gs:// test talks to real servers on
127.0.0.1, started once per session (``emulator.py`` and ``gateway.py``; this
module puts them together as ``GcsServer`` and holds the fixtures)::

    Beam / google-cloud-storage --http (STORAGE_EMULATOR_HOST)----+
                                                                  v
    TensorFlow's libcurl --HTTPS_PROXY: CONNECT *.googleapis.com:443,
        TLS with a cert of a test CA (CURL_CA_BUNDLE)------> GcsGateway --http--> gcp-storage-emulator
                                                             (thread here)        (child process)

* ``gcp-storage-emulator`` runs as its own process, in memory, and holds the
  data. It serves everything Beam's GcsIO does: listing with prefixes,
  resumable uploads, and the batch copy/delete that Beam's file sinks use to
  finalise.
* ``GcsGateway`` sits in front of it for every client, for three reasons:

  - TensorFlow's GCS filesystem has ``www.googleapis.com`` and
    ``storage.googleapis.com`` compiled in and no emulator setting (the
    tensorflow-io GCS plugin does not load into TF 2.21), but its libcurl
    honours ``HTTPS_PROXY`` and TF hands ``CURL_CA_BUNDLE`` to curl. The
    gateway answers ``CONNECT``, speaks TLS inside the tunnel with a cert
    from a ``trustme`` test CA and forwards plain HTTP to the emulator,
    mapping what TF asks for onto what the emulator serves.
  - It requires the bearer token of the fake credentials (401 without it),
    so a test fails if a client silently falls back to anonymous access
    instead of the Application Default Credentials the product relies on.
  - It answers 403 for chosen buckets: the emulator has no permission model,
    and the product must report a permission error clearly.
  - It makes the network and GCS's manners testable: a fixed delay on every
    request (as a distant bucket has), injected 429/5xx answers for chosen
    objects (before the emulator sees the request, or after it carried a
    write out, as when an answer is lost), paged listings, and a count of
    the requests in flight at once.
  - It forwards a media upload of JSON (``Content-Type: application/json``)
    as the equivalent multipart upload: the emulator would parse the body as
    JSON metadata and fail (a run's claim is such an upload).
  - It enforces generation preconditions, which the emulator ignores: an
    upload (media, multipart, or the start of a resumable one) or an object
    delete with ``ifGenerationMatch=N`` gets GCS's 412 ``conditionNotMet``
    unless the object's current generation is N (0: the object must not
    exist; a delete of a missing object stays the emulator's 404). The check
    and the write happen under the lock that already makes the gateway
    forward one request at a time, so no other request lands between them:
    atomic, as on GCS. A resumable upload is checked when it starts, not
    again when its last chunk arrives; preconditions inside batch bodies and
    ``ifGenerationNotMatch``/``ifMetageneration*`` are not enforced.

Generations
-----------
The emulator gives every write a new generation, its ``time.time_ns()``, and
reports it with a new ``updated`` time in the upload's answer and in the
object's metadata, as GCS does; ``test_gcs.py`` checks this, since
the preconditions above rely on it. The numbers only ever grow while the
clock does.

Credentials
-----------
Without credentials, Beam's lookup (``google.auth.default`` inside Beam's
own retry with back-off) took 18-27 s per process here before Beam went
anonymous, with or without ``NO_GCE_CHECK=true``: the time is Beam's retry,
not the metadata probe. Instead ``GOOGLE_APPLICATION_CREDENTIALS``
names a fake *authorized_user* ADC file (the kind ``gcloud auth
application-default login`` writes) that holds an access token with a
far-future expiry: ``google.auth.default`` returns at once, nothing is
refreshed, and Beam builds its storage client *with* credentials as it does
in production; every request carries ``Authorization: Bearer <token>``. A
``FileSystems.match`` in a fresh process then takes well under a second.
TensorFlow ignores the cached token and refreshes it at
``https://www.googleapis.com/oauth2/v3/token``, which goes through the proxy;
the gateway answers with the same token.

Environment
-----------
``GcsServer.env()`` holds the variables (see its docstring for why each);
``GcsServer.subprocess_env()`` is a full environment for child processes:
the pipeline run as ``python -m pipelines.prepare_images``, Beam's
multi-processing workers, TF readers. The ``gcs_env`` fixture also puts the
variables into ``os.environ`` for the test, which child processes inherit.

TensorFlow reads its GCS retry and timeout settings and fetches its token
once per process, when the process first touches gs://; the proxy and the CA
bundle it reads per request. The values are fixed for the session, so
in-process TF works once ``gcs_env`` is in place, but if TF touched gs://
earlier in the process it keeps its old settings. Run TF code in a child
process (``GcsServer.run``) unless the test owns the whole process. Beam and
google-auth also decide on credentials once per process: in-process Beam
gs:// code must run under ``gcs_env`` (every bucket fixture implies it).

Errors
------
A missing bucket is the emulator's own 404: Beam raises ``BeamIOError``
around google-cloud-storage's ``NotFound``, TF ``tf.errors.NotFoundError``.
A forbidden bucket gets a GCS-style 403 from the gateway: Beam raises
``BeamIOError`` around ``Forbidden`` (``google.api_core.exceptions.Forbidden``
itself when reading an object), TF ``tf.errors.PermissionDeniedError`` (but
TF's ``listdir`` reports any failure as NotFound). A request without the test
token gets 401, which an anonymous google-cloud-storage client reports as
"Anonymous credentials cannot be refreshed".

Usage::

    def test_pipeline_writes_to_gcs(gcs_server, gcs_bucket, tmp_path):
        make_tree(tmp_path / "in", {"cats": 2})
        gcs_bucket.upload_tree(tmp_path / "in", "images")
        gcs_server.run(prepare_images.command(
                           *pipeline_flags(gcs_bucket.url("images"), gcs_bucket.url("out"))),
                       cwd=REPO_ROOT)  # or conftest's run_prepare(..., env=gcs_env)
        assert gcs_bucket.list_names("out/")

    def test_reader(gcs_server, gcs_bucket):
        gcs_server.run(child("read_gs_train", gcs_bucket.url("out"), ...), cwd=REPO)  # tests/children

Fixtures
--------
``gcs_server`` (session)   the running servers and helpers, ``GcsServer``
``gcs_env``                the variables in ``os.environ``; returns the full env
``gcs_bucket``             a new, empty ``GcsBucket`` with a unique name
``gcs_missing_bucket``     the name of a bucket that does not exist (404)
``gcs_forbidden_bucket``   an existing ``GcsBucket`` that answers 403
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import pathlib
import ssl
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence

import pytest
import trustme
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from .emulator import LOOPBACK, EmulatorProcess
from .gateway import ACCESS_TOKEN, PROJECT, GcsGateway

_log = logging.getLogger(__name__)

_DEFAULT_RUN_TIMEOUT_S = 180.0

# TensorFlow's defaults (1 s first back-off, 32 s cap, 10 retries, request
# timeouts of up to an hour) turn a broken setup into a hang of many minutes;
# these make it fail in seconds. Every request here is local and small.
_TF_GCS_SETTINGS = {
    "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "10000",
    "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "200000",
    "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
    "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "5",
    "GCS_REQUEST_IDLE_TIMEOUT_SECS": "20",
    "GCS_METADATA_REQUEST_TIMEOUT_SECS": "20",
    "GCS_READ_REQUEST_TIMEOUT_SECS": "30",
    "GCS_WRITE_REQUEST_TIMEOUT_SECS": "30",
}


class GcsBucket:
    """A bucket in the emulator, with helpers that bypass the gateway.

    The helpers use an anonymous client of their own pointed straight at the
    emulator, so setting up and checking data depends neither on the
    environment under test nor on the gateway: it works for a forbidden
    bucket and does not show in ``GcsGateway.seen``.
    """

    def __init__(self, client: storage.Client, name: str) -> None:
        self.name = name
        self._bucket = client.bucket(name)

    def url(self, path: str = "") -> str:
        """``gs://NAME/path``."""
        return f"gs://{self.name}/{path}"

    def write_bytes(self, name: str, data: bytes) -> str:
        """Writes object ``name``; returns its gs:// URL."""
        self._bucket.blob(name).upload_from_string(data)
        return self.url(name)

    def read_bytes(self, name: str) -> bytes:
        return self._bucket.blob(name).download_as_bytes()

    def exists(self, name: str) -> bool:
        return self._bucket.blob(name).exists()

    def list_names(self, prefix: str = "") -> list[str]:
        """Object names starting with ``prefix``, sorted."""
        return sorted(blob.name for blob in self._bucket.list_blobs(prefix=prefix or None))

    def upload_tree(self, root: pathlib.Path, prefix: str = "", threads: int = 1) -> list[str]:
        """Copies every file under ``root`` to ``gs://NAME/prefix/<relative path>``.

        ``threads`` uploads run at once (for large trees). Returns the gs:// URLs written, sorted.
        """
        base = prefix.strip("/")
        names = {}
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            relative = path.relative_to(root).as_posix()
            names[f"{base}/{relative}" if base else relative] = path

        def upload(name: str) -> str:
            self._bucket.blob(name).upload_from_filename(str(names[name]))
            return self.url(name)

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            return list(pool.map(upload, names))

    def download_tree(self, prefix: str, dest: pathlib.Path) -> list[pathlib.Path]:
        """Copies every object under folder ``prefix`` to ``dest/<rest of its name>``."""
        base = prefix.strip("/")
        written = []
        for name in self.list_names(f"{base}/" if base else ""):
            target = dest / (name[len(base) + 1:] if base else name)
            target.parent.mkdir(parents=True, exist_ok=True)
            self._bucket.blob(name).download_to_filename(str(target))
            written.append(target)
        return written


class GcsServer:
    """The session's emulator and gateway, with the test CA and credentials."""

    def __init__(self, emulator: EmulatorProcess, gateway: GcsGateway,
                 ca_bundle: pathlib.Path, credentials_file: pathlib.Path) -> None:
        self.emulator = emulator
        self.gateway = gateway
        self.ca_bundle = ca_bundle
        self.credentials_file = credentials_file
        self.access_token = ACCESS_TOKEN
        self._admin = storage.Client(
            project=PROJECT, credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=emulator.url))

    def env(self) -> dict[str, str]:
        """The variables that point Beam, google-cloud-storage and TF here.

        ``STORAGE_EMULATOR_HOST``: google-cloud-storage (Beam's GCS client)
        sends its JSON API requests there (scheme included), to the gateway.
        ``GOOGLE_APPLICATION_CREDENTIALS``: the fake ADC file (see the module
        docstring); ``GOOGLE_CLOUD_PROJECT`` spares google-auth a project
        lookup. ``NO_GCE_CHECK``: neither google-auth nor TF probes the GCE
        metadata server, which here would time out rather than refuse.
        ``HTTPS_PROXY``/``https_proxy`` and ``CURL_CA_BUNDLE``: TF's libcurl
        reaches *.googleapis.com through the gateway and trusts the test CA.
        Python's ``requests`` honours the same two, so any https request from
        Python in this environment ends at the gateway too, never elsewhere.
        ``NO_PROXY``/``no_proxy``: loopback traffic stays direct even where
        an outer proxy is configured. ``GCS_*``: TF's retries and timeouts,
        kept short so a broken setup fails in seconds, not minutes.
        """
        no_proxy = {LOOPBACK, "localhost"}
        for name in ("NO_PROXY", "no_proxy"):
            no_proxy.update(filter(None, os.environ.get(name, "").split(",")))
        joined_no_proxy = ",".join(sorted(no_proxy))
        return {
            "STORAGE_EMULATOR_HOST": self.gateway.url,
            "GOOGLE_APPLICATION_CREDENTIALS": str(self.credentials_file),
            "GOOGLE_CLOUD_PROJECT": PROJECT,
            "NO_GCE_CHECK": "true",
            "HTTPS_PROXY": self.gateway.url,
            "https_proxy": self.gateway.url,
            "NO_PROXY": joined_no_proxy,
            "no_proxy": joined_no_proxy,
            "CURL_CA_BUNDLE": str(self.ca_bundle),
            **_TF_GCS_SETTINGS,
        }

    def subprocess_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A full environment for a child: ``os.environ``, ``env()``, then ``extra``."""
        return {**os.environ, **self.env(), **(extra or {})}

    def run(self, argv: Sequence[str], *, cwd: pathlib.Path | str | None = None,
            extra_env: Mapping[str, str] | None = None,
            timeout_s: float = _DEFAULT_RUN_TIMEOUT_S,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs ``argv`` with ``subprocess_env(extra_env)``, killed after ``timeout_s``.

        With ``check``, a non-zero exit fails the test and shows the output;
        without, the caller inspects ``returncode`` and ``stderr`` (for the
        error cases the product must report).
        """
        result = subprocess.run(
            list(argv), cwd=cwd, env=self.subprocess_env(extra_env), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout_s)
        if check and result.returncode != 0:
            pytest.fail(f"{' '.join(argv)} exited with {result.returncode}\n--- stdout\n"
                        f"{result.stdout[-6000:]}\n--- stderr\n{result.stderr[-6000:]}",
                        pytrace=False)
        return result

    def new_bucket(self, name: str | None = None) -> GcsBucket:
        """Creates a bucket in the emulator, by default with a unique name.

        Nothing removes it: the emulator keeps data in memory and ends with
        the session, and unique names keep tests apart.
        """
        bucket = GcsBucket(self._admin, name or unique_bucket_name())
        self._admin.create_bucket(bucket.name)
        return bucket

    @staticmethod
    def missing_bucket_name() -> str:
        """A bucket name that nobody creates: GCS answers 404 for it."""
        return unique_bucket_name("missing")

    @contextlib.contextmanager
    def forbidden_bucket(self) -> Iterator[GcsBucket]:
        """A new bucket for which the gateway answers 403 inside the block.

        The emulator has no permission model, so the gateway injects it; the
        bucket's own helpers bypass the gateway and still work.
        """
        bucket = self.new_bucket(unique_bucket_name("forbidden"))
        self.gateway.forbid(bucket.name)
        try:
            yield bucket
        finally:
            self.gateway.allow(bucket.name)


def unique_bucket_name(prefix: str = "bp") -> str:
    """A valid bucket name that no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def _write_test_credentials(path: pathlib.Path) -> None:
    """An authorized_user ADC file whose access token never needs a refresh.

    google-auth ignores ``token_uri`` for this type and would refresh at
    oauth2.googleapis.com; a valid token with a far expiry means it never does.
    """
    path.write_text(json.dumps({
        "type": "authorized_user",
        "client_id": "beam-prep-test.apps.googleusercontent.com",
        "client_secret": "beam-prep-test-secret",
        "refresh_token": "beam-prep-test-refresh-token",
        "token": ACCESS_TOKEN,
        "expiry": "2999-01-01T00:00:00Z",
    }))


def _tls_context(ca: trustme.CA) -> ssl.SSLContext:
    """The server side of the tunnels: a cert for *.googleapis.com."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("*.googleapis.com").configure_cert(context)
    context.set_alpn_protocols(["http/1.1"])  # no HTTP/2 here
    return context


@contextlib.contextmanager
def running_gcs_server(workdir: pathlib.Path) -> Iterator[GcsServer]:
    """The emulator process and the gateway, for the block: for the tests and the benchmarks."""
    ca = trustme.CA()
    ca_bundle = workdir / "test-ca.pem"
    ca.cert_pem.write_to_path(str(ca_bundle))
    credentials_file = workdir / "application_default_credentials.json"
    _write_test_credentials(credentials_file)

    emulator = EmulatorProcess(workdir)
    emulator.start()
    try:
        gateway = GcsGateway(emulator.port, _tls_context(ca))
        gateway.start()
        try:
            _log.info("GCS gateway on %s", gateway.url)
            yield GcsServer(emulator, gateway, ca_bundle, credentials_file)
        finally:
            gateway.stop()
    finally:
        emulator.stop()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsServer]:
    """Starts the emulator process and the gateway for the whole session."""
    with running_gcs_server(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture
def gcs_env(gcs_server: GcsServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Puts ``gcs_server.env()`` into ``os.environ`` for this test.

    Returns the full environment for child processes (``subprocess_env()``).
    """
    for name, value in gcs_server.env().items():
        monkeypatch.setenv(name, value)
    return gcs_server.subprocess_env()


@pytest.fixture
def gcs_bucket(gcs_server: GcsServer, gcs_env: dict[str, str]) -> GcsBucket:
    """A new, empty bucket with a unique name."""
    return gcs_server.new_bucket()


@pytest.fixture
def gcs_missing_bucket(gcs_server: GcsServer, gcs_env: dict[str, str]) -> str:
    """The name of a bucket that does not exist; GCS answers 404 for it."""
    return gcs_server.missing_bucket_name()


@pytest.fixture
def gcs_forbidden_bucket(gcs_server: GcsServer, gcs_env: dict[str, str]) -> Iterator[GcsBucket]:
    """An existing bucket for which the code under test gets 403 Forbidden
    (its helpers still work, for setting up data)."""
    with gcs_server.forbidden_bucket() as bucket:
        yield bucket
