"""The committed modules in brain/api/pb must match proto/."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.servers import unavailable

try:
    import grpc_tools  # noqa: F401
except ImportError:  # pinned in the test extra
    unavailable("grpcio-tools is not installed (pip install -e '.[test]')", module=True)

from google.protobuf import descriptor_pb2  # noqa: E402

from brain.api import genproto  # noqa: E402
from brain.api.pb.authpb import auth_pb2  # noqa: E402
from brain.api.pb.etcdserverpb import rpc_pb2  # noqa: E402
from brain.api.pb.grpc.health.v1 import health_pb2  # noqa: E402
from brain.api.pb.mvccpb import kv_pb2  # noqa: E402


def _committed_grpc_tools_version() -> str:
    text = (genproto.PB_ROOT / "etcdserverpb" / "rpc_pb2_grpc.py").read_text()
    m = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'", text, re.MULTILINE)
    assert m, "rpc_pb2_grpc.py has no GRPC_GENERATED_VERSION"
    return m.group(1)


def test_generated_modules_are_byte_identical_to_a_fresh_run():
    committed = _committed_grpc_tools_version()
    installed = importlib.metadata.version("grpcio-tools")
    if committed != installed:
        unavailable(
            f"brain/api/pb was generated with grpcio-tools {committed}, "
            f"{installed} is installed; byte-exact check needs the same version "
            "(the descriptor check below still runs)"
        )
    stale = genproto.stale_files()
    assert not stale, (
        "brain/api/pb is stale, run `python -m brain.api.genproto`: " + ", ".join(stale)
    )


def test_check_mode_exit_status():
    proc = subprocess.run(
        [sys.executable, "-m", "brain.api.genproto", "--check"],
        cwd=genproto.REPO_ROOT,
        capture_output=True,
        text=True,
    )
    if _committed_grpc_tools_version() != importlib.metadata.version("grpcio-tools"):
        unavailable("different grpcio-tools version than the committed modules (pip install -e '.[test]')")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_mode_reports_stale_file(tmp_path: Path):
    # A copy of the committed tree with one file altered must be reported.
    for rel, data in genproto.current_files().items():
        dest = tmp_path / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    target = tmp_path / "mvccpb" / "kv_pb2.py"
    target.write_bytes(target.read_bytes() + b"# edited\n")
    (tmp_path / "authpb" / "auth_pb2.pyi").unlink()
    stale = genproto.stale_files(tmp_path)
    assert "mvccpb/kv_pb2.py" in stale
    assert "authpb/auth_pb2.pyi" in stale
    assert genproto.check(tmp_path, verbose=False) == 1


def _normalize(fdp: descriptor_pb2.FileDescriptorProto) -> None:
    """Drop what is not part of the schema or what CopyToProto may omit."""
    fdp.ClearField("source_code_info")

    def strip(messages):
        for m in messages:
            for f in m.field:
                f.ClearField("json_name")
            strip(m.nested_type)

    strip(fdp.message_type)


def test_generated_descriptors_match_proto_sources():
    """Version-independent freshness check: compile proto/ and compare the
    resulting descriptors with those embedded in the committed modules."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{genproto.PROTO_ROOT}",
                f"--descriptor_set_out={out}",
                *[p for p, _ in genproto.PROTO_FILES],
            ],
            check=True,
        )
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    fresh = {f.name: f for f in fds.file}
    for module in (kv_pb2, auth_pb2, rpc_pb2, health_pb2):
        got = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(got)
        want = fresh[module.DESCRIPTOR.name]
        _normalize(got)
        _normalize(want)
        assert got == want, f"{module.__name__} is stale relative to proto/{want.name}"
