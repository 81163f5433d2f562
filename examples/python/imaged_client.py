#!/usr/bin/env python3
"""A Python client of imaged's sockets, with grpcio.

    pip install -r examples/python/requirements.txt
    python3 examples/python/imaged_client.py --socket /run/imaged/imaged.sock status
    python3 examples/python/imaged_client.py --socket /run/imaged/imaged.sock ensure nginx:1.27 --pod default/web-1
    python3 examples/python/imaged_client.py --socket /run/imaged/imaged.sock images
    python3 examples/python/imaged_client.py --cri-socket /run/imaged/cri.sock cri-images

Each command prints one JSON object (the answer, with the proto's field
names). Stubs are generated from proto/ at start with grpcio-tools into a
temporary directory, so nothing generated is kept in the repository.

The one line that matters is in `channel()`: gRPC C-core (Python's grpcio,
and Ruby, PHP, C#'s Grpc.Core), like grpc-java and grpcurl before 1.9, sends
a unix socket's path as the HTTP/2 `:authority` header. imaged serves its
sockets with Rust's HTTP/2 server (hyper/h2), which refuses an authority
that is not a host (hyperium/h2 pull request 487, open since 2020) and
resets every call with PROTOCOL_ERROR, which grpcio reports as:

    StatusCode.INTERNAL: Stream removed (RST_STREAM (Received RST_STREAM with error code 1))

Setting the channel's default authority to "localhost" (what Go clients,
crictl and the kubelet send) makes every call work. `--no-authority-fix`
leaves it out, to see the failure.
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile

import grpc
from google.protobuf import json_format

# The fix: without it every call to an imaged socket fails (see above).
AUTHORITY_FIX = [("grpc.default_authority", "localhost")]

REPO = pathlib.Path(__file__).resolve().parents[2]


def load_stubs(proto_dir):
    """Generates the Python modules of imaged's API and of CRI v1 from
    `proto_dir` into a temporary directory and imports them."""
    from grpc_tools import protoc  # grpcio-tools

    out = tempfile.mkdtemp(prefix="imaged-stubs-")
    protos = ["imaged/v1/imaged.proto", "runtime/v1/api.proto"]
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    args = ["protoc", f"-I{proto_dir}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}"]
    if protoc.main(args + protos) != 0:
        sys.exit(f"generating the stubs from {proto_dir} failed")
    sys.path.insert(0, out)
    from imaged.v1 import imaged_pb2, imaged_pb2_grpc
    from runtime.v1 import api_pb2, api_pb2_grpc

    return imaged_pb2, imaged_pb2_grpc, api_pb2, api_pb2_grpc


def channel(socket, authority_fix=True):
    """A channel to a unix socket of imaged (the API socket, the CRI socket
    in the kubelet's path, or the embedded runtime's socket)."""
    options = AUTHORITY_FIX if authority_fix else []
    return grpc.insecure_channel(f"unix://{socket}", options=options)


def emit(message):
    print(json.dumps(json_format.MessageToDict(message, preserving_proto_field_name=True), sort_keys=True))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--socket", default="/run/imaged/imaged.sock", help="imaged's API socket (daemon.socket)")
    p.add_argument("--cri-socket", help="a CRI socket: imaged's [cri_server] socket or the embedded runtime's")
    p.add_argument("--proto-dir", default=str(REPO / "proto"), help="where imaged's .proto files are")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per call")
    p.add_argument("--no-authority-fix", action="store_true", help="send the socket path as :authority (fails)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="GetStatus")
    sub.add_parser("images", help="ListImages")
    ensure = sub.add_parser("ensure", help="EnsureImage: the kubelet's EnsureImageExists for one image")
    ensure.add_argument("image")
    ensure.add_argument("--pod", default="default/python-client", help="NAMESPACE/NAME")
    ensure.add_argument("--pod-uid", default="python-client-uid")
    ensure.add_argument("--pull-policy", default="", help="Always, IfNotPresent, Never (empty: by tag)")
    sub.add_parser("cri-images", help="CRI ImageService/ListImages on --cri-socket")
    args = p.parse_args()

    imaged_pb2, imaged_pb2_grpc, api_pb2, api_pb2_grpc = load_stubs(args.proto_dir)
    fix = not args.no_authority_fix
    try:
        if args.command == "cri-images":
            if not args.cri_socket:
                p.error("cri-images needs --cri-socket")
            with channel(args.cri_socket, fix) as ch:
                emit(api_pb2_grpc.ImageServiceStub(ch).ListImages(api_pb2.ListImagesRequest(), timeout=args.timeout))
            return 0
        with channel(args.socket, fix) as ch:
            api = imaged_pb2_grpc.ImagedStub(ch)
            if args.command == "status":
                emit(api.GetStatus(imaged_pb2.GetStatusRequest(), timeout=args.timeout))
            elif args.command == "images":
                emit(api.ListImages(imaged_pb2.ListImagesRequest(), timeout=args.timeout))
            elif args.command == "ensure":
                namespace, _, name = args.pod.partition("/")
                if not name:
                    p.error("--pod is NAMESPACE/NAME")
                pod = imaged_pb2.Pod(uid=args.pod_uid, namespace=namespace, name=name)
                req = imaged_pb2.EnsureImageRequest(
                    pod=pod, container="main", image=args.image, pull_policy=args.pull_policy
                )
                answer = api.EnsureImage(req, timeout=args.timeout)
                emit(answer)
                # As imagectl: 2 when the image could not be ensured.
                return 0 if answer.WhichOneof("result") == "ok" else 2
        return 0
    except grpc.RpcError as e:
        print(f"imaged_client: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
