"""--auth-token as etcd parses it (decomposeOpts, jwtOptions): the errors
it starts with, and JWTs that verify only unchanged, unexpired and with
the configured method (interoperation with etcd's own JWTs:
tests/differential/test_auth_vs_etcd.py)."""

from __future__ import annotations

import json
import time

import pytest

from brain.api.auth_tokens import SimpleTokens, TokenOptionError, _b64url, check_option, jwt_tokens, token_provider
from brain.engine.tokens import TokenTable


@pytest.mark.parametrize("option, error", [
    ("bogus", "auth: invalid auth options"),
    ("simple,x", "auth: invalid auth options"),
    ("jwt,sign-method=HS256,sign-method=HS256", "auth: invalid auth options"),
    ("jwt,sign-method=XS999", "auth: invalid auth options (auth: invalid auth signature method)"),
    ("jwt,sign-method=HS256", "auth: missing key data"),
    ("jwt,sign-method=RS256", "auth: missing key data"),
    ("jwt,sign-method=HS256,priv-key=/nonexistent/key",
     "auth: invalid auth options (open /nonexistent/key: no such file or directory)"),
])
def test_bad_options_are_refused_with_etcds_errors(option, error):
    with pytest.raises(TokenOptionError) as e:
        check_option(option)
    assert str(e.value) == error


def test_simple_tokens_look_like_etcds_and_name_the_current_revision():
    table = TokenTable()
    tokens = token_provider("simple", table)
    assert isinstance(tokens, SimpleTokens)
    token = tokens.new_token()
    prefix, _, seq = token.partition(".")
    assert len(prefix) == 16 and prefix.isalpha() and seq.isdigit()
    assert tokens.info(token, 7) is None
    table.apply([(1, token, "alice")])
    assert tokens.info(token, 7).user == "alice" and tokens.info(token, 9).revision == 9


def test_a_jwt_verifies_only_as_issued(tmp_path):
    (tmp_path / "k").write_bytes(b"secret")
    tokens = jwt_tokens({"sign-method": "HS256", "priv-key": str(tmp_path / "k"), "ttl": "1s"})
    token = tokens.issue("", "alice", 5)
    head, body, sig = token.split(".")
    assert json.loads(__import__("base64").urlsafe_b64decode(head + "==")) == {"alg": "HS256", "typ": "JWT"}
    info = tokens.info(token, 99)
    assert (info.user, info.revision) == ("alice", 5)  # the revision it was issued at
    forged = _b64url(json.dumps({"exp": int(time.time()) + 60, "revision": 9, "username": "root"}).encode())
    assert tokens.info(f"{head}.{forged}.{sig}", 9) is None
    assert tokens.info("a.b", 9) is None and tokens.info("x.y.z", 9) is None
    other = jwt_tokens({"sign-method": "HS384", "priv-key": str(tmp_path / "k")})
    assert other.info(token, 9) is None  # another method
    time.sleep(1.1)
    assert tokens.info(token, 5) is None  # expired


def test_a_public_key_alone_verifies_but_issues_nothing(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "priv").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    (tmp_path / "pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                 serialization.PublicFormat.SubjectPublicKeyInfo))
    signer = jwt_tokens({"sign-method": "ES256", "priv-key": str(tmp_path / "priv"), "pub-key": str(tmp_path / "pub")})
    verifier = jwt_tokens({"sign-method": "ES256", "pub-key": str(tmp_path / "pub")})
    token = signer.issue("", "bob", 3)
    assert verifier.info(token, 3).user == "bob"
    with pytest.raises(TokenOptionError):
        verifier.issue("", "bob", 3)
    other = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "other").write_bytes(other.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    with pytest.raises(TokenOptionError) as e:
        jwt_tokens({"sign-method": "ES256", "priv-key": str(tmp_path / "other"), "pub-key": str(tmp_path / "pub")})
    assert str(e.value) == "auth: public and private keys don't match"
