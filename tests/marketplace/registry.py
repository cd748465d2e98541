"""A small Docker registry (the Registry HTTP API v2, read-only) serving one image, so a test can
make Docker Engine really pull: from 127.0.0.1 Docker speaks plain HTTP to a registry by default.

The image is the local busybox test image with one file added to its layer, so its layer is
new to the engine and is downloaded and extracted (not "Already exists").
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _image_blobs(base: str) -> tuple[bytes, dict[str, bytes]]:
    """(manifest, blobs by digest) for ``base`` with a unique file added to its layer."""
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp, "image.tar")
        subprocess.run(["docker", "save", base, "-o", str(saved)], check=True)
        with tarfile.open(saved) as archive:
            index = json.load(archive.extractfile("manifest.json"))[0]
            config = json.load(archive.extractfile(index["Config"]))
            layer = archive.extractfile(index["Layers"][0]).read()
    marker = f"pulled {uuid.uuid4()}\n".encode()
    buffer = io.BytesIO(layer)
    with tarfile.open(fileobj=buffer, mode="a") as tar:
        info = tarfile.TarInfo("etc/gpumkt-pull-test")
        info.size = len(marker)
        tar.addfile(info, io.BytesIO(marker))
    layer = buffer.getvalue()
    config["rootfs"]["diff_ids"] = [_digest(layer)]
    config_blob = json.dumps(config).encode()
    layer_blob = gzip.compress(layer, mtime=0)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "size": len(config_blob),
            "digest": _digest(config_blob),
        },
        "layers": [
            {
                "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "size": len(layer_blob),
                "digest": _digest(layer_blob),
            }
        ],
    }
    blobs = {_digest(config_blob): config_blob, _digest(layer_blob): layer_blob}
    return json.dumps(manifest).encode(), blobs


class Registry:
    """Serves ``<address>/<name>:<tag>`` until ``close()``."""

    def __init__(self, base_image: str, name: str = "gpumkt/pulltest"):
        # 12 hex digits on purpose, like a short git SHA: the pull's "<tag>: Pulling from …"
        # line looks like a layer's and must not be counted as one.
        self.name, self.tag = name, uuid.uuid4().hex[:12]
        manifest, blobs = _image_blobs(base_image)
        handler = _handler(name, self.tag, manifest, blobs)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def image(self) -> str:
        return f"{self.address}/{self.name}:{self.tag}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        subprocess.run(["docker", "image", "rm", "--force", self.image], capture_output=True)


def _handler(name: str, tag: str, manifest: bytes, blobs: dict[str, bytes]):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep the test output quiet
            pass

        def _send(self, status: int, body: bytes, content_type: str, digest: str = "") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path in ("/v2/", "/v2"):
                return self._send(200, b"{}", "application/json")
            if path in (f"/v2/{name}/manifests/{tag}", f"/v2/{name}/manifests/{_digest(manifest)}"):
                return self._send(200, manifest, MANIFEST_TYPE, _digest(manifest))
            prefix = f"/v2/{name}/blobs/"
            if path.startswith(prefix) and path[len(prefix) :] in blobs:
                digest = path[len(prefix) :]
                return self._send(200, blobs[digest], "application/octet-stream", digest)
            error = {"errors": [{"code": "NAME_UNKNOWN", "message": "not here"}]}
            return self._send(404, json.dumps(error).encode(), "application/json")

        do_HEAD = do_GET

    return Handler
