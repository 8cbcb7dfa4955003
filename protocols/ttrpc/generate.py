"""Regenerate the ``*_pb2.py`` and ``*_pb2.pyi`` modules from this folder's ``.proto`` files.

``ttrpc.proto`` holds the messages of the ttrpc wire protocol itself;
``messaging.proto`` the gateway's built-in ``interchange.v1.Messaging``
service. Both are compiled by one protoc run, and the generated modules are
committed.

Run from the repository's root: ``python protocols/ttrpc/generate.py``. It
needs ``grpcio-tools`` (which bundles protoc), best in a virtualenv of its
own so that its protobuf pin does not touch the project's: ``python -m venv
/tmp/protoc && /tmp/protoc/bin/pip install grpcio-tools==1.85.1 &&
/tmp/protoc/bin/python protocols/ttrpc/generate.py``. The generated code
must not be newer than the protobuf runtime the project requires.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from grpc_tools import protoc

#: The protos compiled, relative to this folder.
PROTOS = ("ttrpc.proto", "messaging.proto")


def main() -> int:
    here = Path(__file__).resolve().parent
    include = Path(protoc.__file__).resolve().parent / "_proto"
    os.chdir(here)
    return protoc.main(["protoc", f"-I{include}", "-I.", "--python_out=.", "--pyi_out=.", *PROTOS])


if __name__ == "__main__":
    sys.exit(main())
