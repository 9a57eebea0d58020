"""The gRPC services behind TLS and the shared token, over real TLS on loopback.

Certificates are made here with the `openssl` command line (a test CA, a server certificate for localhost and
127.0.0.1, a client certificate, and a second CA that signed none of them). One verifier process, the cheapest
service, serves mutual TLS and requires the token; each test is a client that gets one thing right or wrong.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from cooper.config import SecurityConfig, ServerConfig, load_config, mask_url_password, to_yaml
from cooper.runtime import healthcheck
from cooper.runtime.client import ServiceUnavailable
from cooper.runtime.processes import start_service
from cooper.services.verifier.client import VerifierClient

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "test-token-0123456789"
NO_RETRY = ServerConfig(unavailable_timeout_s=0, deadline_s=20)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca(directory: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=directory)


def _make_cert(directory: Path, name: str, ca: str, extensions: str) -> None:
    """A key and a certificate signed by `ca`, with the given X.509v3 extensions."""
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=directory)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """ca (signs everything), other-ca (signs nothing we use), server (localhost, 127.0.0.1), client."""
    directory = tmp_path_factory.mktemp("pki")
    _make_ca(directory, "ca")
    _make_ca(directory, "other-ca")
    _make_cert(directory, "server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                          "extendedKeyUsage=serverAuth,clientAuth\n")
    _make_cert(directory, "client", "ca", "extendedKeyUsage=clientAuth\n")
    return directory


@pytest.fixture(scope="module")
def tls_verifier(pki):
    """A verifier serving mutual TLS (its CA given) with the token, plus a plaintext health port."""
    service = start_service("verifier", overrides=[
        "verifier.workers=1", "verifier.server.health_port=0", "verifier.server.metrics_port=null",
        f"security.token={TOKEN}",
        f"security.tls_cert={pki / 'server.pem'}", f"security.tls_key={pki / 'server.key'}",
        f"security.tls_ca={pki / 'ca.pem'}"])
    yield service
    service.stop()


def _security(pki: Path, ca: str = "ca", client_cert: bool = True, token: str | None = TOKEN) -> SecurityConfig:
    cert = {"tls_cert": str(pki / "client.pem"), "tls_key": str(pki / "client.key")} if client_cert else {}
    return SecurityConfig(tls_ca=str(pki / f"{ca}.pem"), token=token, **cert)


def _verify_one(client: VerifierClient) -> str:
    from cooper.services.verifier.client import Verdict

    return Verdict.Name(client.verify_pairs([("\\boxed{4}", "4")])[0].verdict)


def test_right_ca_client_cert_and_token_are_served(tls_verifier, pki):
    with VerifierClient(tls_verifier.address, NO_RETRY, _security(pki)) as client:
        assert _verify_one(client) == "CORRECT"


def test_a_missing_or_wrong_token_is_unauthenticated(tls_verifier, pki):
    for token, reason in ((None, "no `authorization: Bearer` metadata"), ("guess", "a wrong bearer token")):
        with VerifierClient(tls_verifier.address, NO_RETRY, _security(pki, token=token)) as client:
            with pytest.raises(grpc.RpcError) as err:
                _verify_one(client)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert reason in err.value.details() and "security.token" in err.value.details()


def test_a_server_signed_by_another_ca_is_refused(tls_verifier, pki):
    with VerifierClient(tls_verifier.address, NO_RETRY, _security(pki, ca="other-ca")) as client:
        with pytest.raises(ServiceUnavailable, match="TLS failed: does security.tls_ca sign") as err:
            _verify_one(client)
    assert isinstance(err.value.__cause__, grpc.RpcError)
    assert err.value.__cause__.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_refuses_a_client_without_a_certificate(tls_verifier, pki):
    with VerifierClient(tls_verifier.address, NO_RETRY, _security(pki, client_cert=False)) as client:
        with pytest.raises(ServiceUnavailable) as err:
            _verify_one(client)
    assert err.value.__cause__.code() == grpc.StatusCode.UNAVAILABLE


def test_a_plaintext_client_is_told_to_set_the_ca(tls_verifier):
    with VerifierClient(tls_verifier.address, NO_RETRY, SecurityConfig(token=TOKEN)) as client:
        with pytest.raises(ServiceUnavailable) as err:
            _verify_one(client)
    assert err.value.__cause__.code() == grpc.StatusCode.UNAVAILABLE


def test_health_answers_over_tls_without_the_token_and_on_the_plaintext_port(tls_verifier, pki, monkeypatch):
    # The health service needs no token: a client without one is told SERVING.
    with VerifierClient(tls_verifier.address, NO_RETRY, _security(pki, token=None)) as client:
        assert client.healthy(timeout_s=10)
    assert healthcheck.check(tls_verifier.address, timeout_s=10, security=_security(pki, token=None))[0]
    # Reflection is open too (`grpcurl list` without the token), and lists the verifier.
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    from cooper.runtime.security import secure_channel

    with secure_channel(tls_verifier.address, _security(pki, token=None), []) as channel:
        assert "cooper.verifier.v1.Verifier" in ProtoReflectionDescriptorDatabase(channel).get_services()
    # The plaintext health port (what a Kubernetes grpc probe reaches) serves health, and nothing else.
    health_address = f"127.0.0.1:{tls_verifier.info['health_port']}"
    assert healthcheck.check(health_address, timeout_s=10) == (True, f"{health_address}: SERVING")
    with VerifierClient(health_address, NO_RETRY, SecurityConfig(token=TOKEN)) as client:
        with pytest.raises(grpc.RpcError) as err:
            _verify_one(client)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    # The container healthcheck, with the service's COOPER_SECURITY__* environment and with its ready file.
    env = {"COOPER_SECURITY__TLS_CA": str(pki / "ca.pem"), "COOPER_SECURITY__TLS_CERT": str(pki / "server.pem"),
           "COOPER_SECURITY__TLS_KEY": str(pki / "server.key"), "COOPER_SECURITY__TOKEN": TOKEN}
    for args, extra in (([tls_verifier.address], env), (["--ready-file", str(tls_verifier.ready_path)], {}),
                        ([tls_verifier.address, "--timeout", "5"], {})):
        result = subprocess.run([sys.executable, "-m", "cooper.runtime.healthcheck", *args], cwd=ROOT,
                                capture_output=True, text=True, timeout=60,
                                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **extra})
        wanted = 1 if not extra and "--ready-file" not in args else 0  # plaintext to the TLS port: unhealthy
        assert result.returncode == wanted, (args, result.stderr)


def test_security_config_rules():
    assert SecurityConfig(token="").token is None  # an empty secret variable means "no token"
    with pytest.raises(ValueError, match="tls_cert and security.tls_key go together"):
        SecurityConfig(tls_cert="a.pem")
    config = load_config(environ={"COOPER_SECURITY__TOKEN": "t0ken", "COOPER_REDIS__URL": "redis://:pw@h:1/0"})
    assert config.security.token.get_secret_value() == "t0ken"
    shown = to_yaml(config)
    assert "t0ken" not in shown and ":pw@" not in shown and "redis://:**********@h:1/0" in shown
    assert mask_url_password("redis://redis:6379/0") == "redis://redis:6379/0"
    with pytest.raises(FileNotFoundError, match="security.tls_ca = /nope.pem"):
        VerifierClient("127.0.0.1:1", NO_RETRY, SecurityConfig(tls_ca="/nope.pem"))
