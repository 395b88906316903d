"""etcd's token providers, chosen by ``--auth-token``: simple tokens and JWT.

* ``simple`` (etcd's default): 16 random letters, a dot and a number.  The
  token is chosen here and journaled by Authenticate, so every replica
  that applied it honours it (brain.engine.tokens keeps them, each with
  ``--auth-token-ttl``); it names the auth revision current when it is
  used, as etcd's do.
* ``jwt,pub-key=...,priv-key=...,sign-method=...[,ttl=...]``: signed
  claims {"exp", "revision", "username"}, verifiable by any replica with
  the key; a token names the auth revision it was issued at, so any change
  of users or roles after it makes it old (``ErrAuthOldRevision``; clients
  authenticate again), as in etcd.  Signing methods are golang-jwt's:
  RS256/384/512, PS256/384/512, ES256/384/512, EdDSA, HS256/384/512; a key
  pair must match; a public key alone verifies but cannot issue tokens.

The option string is parsed as etcd's decomposeOpts and jwtOptions parse
it; ``TokenOptionError`` carries etcd's wording.  RSA, ECDSA and Ed25519
need the ``cryptography`` package, imported only for them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import string
import threading
import time

from brain import go_duration
from brain.mvcc.auth import AuthInfo

_LETTERS = string.ascii_lowercase + string.ascii_uppercase  # etcd's simple token alphabet
SIMPLE_TOKEN_LETTERS = 16
DEFAULT_JWT_TTL = 300.0  # etcd's jwt DefaultTTL, 5 minutes
_VERIFIED_CACHE = 4096  # JWTs whose signature was checked, kept to skip the check next time


class TokenOptionError(ValueError):
    """An --auth-token value etcd would refuse."""


class SimpleTokens:
    """Simple tokens: made here, journaled by Authenticate, looked up in the
    engine's table (brain.engine.tokens)."""

    kind = "simple"

    def __init__(self, table) -> None:
        self.table = table
        self._seq = 0
        self._lock = threading.Lock()

    def new_token(self) -> str:
        """A token to assign: etcd's 16 random letters, a dot and a number
        (etcd's raft index of the Authenticate; here this replica's count of
        tokens made: the letters alone tell tokens apart)."""
        with self._lock:
            self._seq += 1
            seq = self._seq
        return "".join(secrets.choice(_LETTERS) for _ in range(SIMPLE_TOKEN_LETTERS)) + f".{seq}"

    def issue(self, token: str, user: str, revision: int) -> str:
        return token

    def info(self, token: str, revision: int) -> AuthInfo | None:
        user = self.table.user_of(token)
        return None if user is None else AuthInfo(user, revision)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_HASHES = {"256": hashlib.sha256, "384": hashlib.sha384, "512": hashlib.sha512}
METHODS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA",
           "HS256", "HS384", "HS512")


class JwtTokens:
    """JWTs signed with the configured key (etcd's tokenJWT)."""

    kind = "jwt"

    def __init__(self, method: str, key, verify_key, ttl: float, verify_only: bool) -> None:
        self.method = method
        self.key = key  # what signs (bytes for HMAC)
        self.verify_key = verify_key  # what verifies
        self.ttl = ttl
        self.verify_only = verify_only
        self._verified: dict[str, tuple[str, int, float | None]] = {}
        self._lock = threading.Lock()

    def new_token(self) -> str:
        return ""  # nothing to journal: a JWT is made once Authenticate is decided

    def issue(self, _token: str, user: str, revision: int) -> str:
        if self.verify_only:
            raise TokenOptionError("auth: token signing attempted with verify-only key")
        claims = {"exp": int(time.time() + self.ttl), "revision": revision, "username": user}
        head = _b64url(json.dumps({"alg": self.method, "typ": "JWT"}, separators=(",", ":")).encode())
        body = _b64url(json.dumps(claims, separators=(",", ":")).encode())
        signing_input = f"{head}.{body}".encode()
        return f"{head}.{body}.{_b64url(self._sign(signing_input))}"

    def info(self, token: str, _revision: int) -> AuthInfo | None:
        with self._lock:
            known = self._verified.get(token)
        if known is None:
            known = self._verify(token)
            if known is None:
                return None
            with self._lock:
                if len(self._verified) >= _VERIFIED_CACHE:
                    self._verified.clear()
                self._verified[token] = known
        user, revision, exp = known
        if exp is not None and time.time() >= exp:
            return None
        return AuthInfo(user, revision)

    def _verify(self, token: str) -> tuple[str, int, float | None] | None:
        parts = token.split(".")
        if len(parts) != 3:
            return None
        try:
            header = json.loads(_unb64url(parts[0]))
            claims = json.loads(_unb64url(parts[1]))
            signature = _unb64url(parts[2])
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(header, dict) or header.get("alg") != self.method or not isinstance(claims, dict):
            return None
        if not self._check(f"{parts[0]}.{parts[1]}".encode(), signature):
            return None
        user, revision, exp = claims.get("username"), claims.get("revision"), claims.get("exp")
        if not isinstance(user, str) or type(revision) not in (int, float) or revision < 0:
            return None
        if exp is not None and type(exp) not in (int, float):
            return None
        nbf = claims.get("nbf")
        if type(nbf) in (int, float) and time.time() < nbf:
            return None
        return user, int(revision), exp

    # -- the algorithms -----------------------------------------------------------

    def _sign(self, data: bytes) -> bytes:
        m = self.method
        if m.startswith("HS"):
            return hmac.new(self.key, data, _HASHES[m[2:]]).digest()
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec, padding, utils
        if m == "EdDSA":
            return self.key.sign(data)
        digest = {"256": hashes.SHA256, "384": hashes.SHA384, "512": hashes.SHA512}[m[2:]]()
        if m.startswith("RS"):
            return self.key.sign(data, padding.PKCS1v15(), digest)
        if m.startswith("PS"):
            return self.key.sign(data, padding.PSS(padding.MGF1(digest), digest.digest_size), digest)
        der = self.key.sign(data, ec.ECDSA(digest))
        r, s = utils.decode_dss_signature(der)
        size = (self.key.curve.key_size + 7) // 8
        return r.to_bytes(size, "big") + s.to_bytes(size, "big")

    def _check(self, data: bytes, signature: bytes) -> bool:
        m = self.method
        if m.startswith("HS"):
            return hmac.compare_digest(hmac.new(self.verify_key, data, _HASHES[m[2:]]).digest(), signature)
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec, padding, utils
        try:
            if m == "EdDSA":
                self.verify_key.verify(signature, data)
                return True
            digest = {"256": hashes.SHA256, "384": hashes.SHA384, "512": hashes.SHA512}[m[2:]]()
            if m.startswith("RS"):
                self.verify_key.verify(signature, data, padding.PKCS1v15(), digest)
            elif m.startswith("PS"):
                self.verify_key.verify(signature, data, padding.PSS(padding.MGF1(digest), padding.PSS.AUTO), digest)
            else:
                size = (self.verify_key.curve.key_size + 7) // 8
                if len(signature) != 2 * size:
                    return False
                der = utils.encode_dss_signature(int.from_bytes(signature[:size], "big"),
                                                 int.from_bytes(signature[size:], "big"))
                self.verify_key.verify(der, data, ec.ECDSA(digest))
            return True
        except InvalidSignature:
            return False


def _parse_duration(text: str) -> float:
    """Go's time.ParseDuration for what a ttl option holds (seconds)."""
    return go_duration.seconds(text)


def parse_options(option: str) -> tuple[str, dict[str, str]]:
    """etcd's decomposeOpts: the token type and its key=value options."""
    parts = option.split(",")
    opts: dict[str, str] = {}
    for part in parts[1:]:
        pair = part.split("=")
        if len(pair) != 2 or pair[0] in opts:
            raise TokenOptionError("auth: invalid auth options")
        opts[pair[0]] = pair[1]
    return parts[0], opts


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TokenOptionError(f"open {path}: {(e.strerror or str(e)).lower()}") from None


def jwt_tokens(opts: dict[str, str]) -> JwtTokens:
    """etcd's newTokenProviderJWT: the signing method, its key or key pair.
    What its option parsing refuses is etcd's "invalid auth options", with
    the reason etcd logs beside it; the keys' own errors are etcd's."""
    try:
        ttl = DEFAULT_JWT_TTL
        if opts.get("ttl"):
            try:
                ttl = _parse_duration(opts["ttl"])
            except ValueError as e:
                raise TokenOptionError(str(e)) from None
        public = _read(opts["pub-key"]) if opts.get("pub-key") else b""
        private = _read(opts["priv-key"]) if opts.get("priv-key") else b""
        method = opts.get("sign-method", "")
        if method not in METHODS:
            raise TokenOptionError("auth: invalid auth signature method")
    except TokenOptionError as e:
        raise TokenOptionError(f"auth: invalid auth options ({e})") from None
    if method.startswith("HS"):
        if not private:
            raise TokenOptionError("auth: missing key data")
        return JwtTokens(method, private, private, ttl, False)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography import x509
    want = {"RS": (rsa.RSAPrivateKey, rsa.RSAPublicKey), "PS": (rsa.RSAPrivateKey, rsa.RSAPublicKey),
            "ES": (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey),
            "Ed": (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)}[method[:2]]
    priv = pub = None
    try:
        if private:
            priv = serialization.load_pem_private_key(private, password=None)
        if public:
            try:
                pub = serialization.load_pem_public_key(public)
            except ValueError:
                pub = x509.load_pem_x509_certificate(public).public_key()
    except (ValueError, TypeError) as e:
        raise TokenOptionError(f"invalid key: {e}") from None
    if priv is not None and not isinstance(priv, want[0]) or pub is not None and not isinstance(pub, want[1]):
        raise TokenOptionError("invalid key: the key's type does not match the signing method")
    if priv is None:
        if pub is None:
            raise TokenOptionError("auth: missing key data")
        return JwtTokens(method, None, pub, ttl, True)
    raw = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if pub is not None and pub.public_bytes(der, raw) != priv.public_key().public_bytes(der, raw):
        raise TokenOptionError("auth: public and private keys don't match")
    return JwtTokens(method, priv, priv.public_key(), ttl, False)


def token_provider(option: str, table):
    """The provider ``--auth-token`` names (``table``: the engine's simple
    token table)."""
    kind, opts = parse_options(option)
    if kind == "simple":
        return SimpleTokens(table)
    if kind == "jwt":
        return jwt_tokens(opts)
    raise TokenOptionError("auth: invalid auth options")


def check_option(option: str) -> None:
    """Refuse an --auth-token value as etcd does at start-up (keys are read)."""
    token_provider(option, None)


__all__ = ["JwtTokens", "SimpleTokens", "TokenOptionError", "check_option", "parse_options", "token_provider"]
