"""Adapter archives: a streamed gzip tar of an adapter folder, and the safe unpacking of an upload.

Unpacking reads the tar as a stream, member by member, and writes nothing whose name came from the
archive: each regular file is copied to a numbered part inside the caller's staging folder and
renamed only once the whole archive was accepted. Refused: absolute paths, `..`, links (symbolic
or hard), devices, FIFOs, sparse files, nested folders, duplicate or hidden names, and more bytes
than the quota (counted while copying, so a gzip bomb stops at the limit).

Pure module (tarfile, zlib; core.errors for the stable codes).
"""

from __future__ import annotations

import re
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from core.errors import DISK_FULL_CODE, DISK_FULL_HINT, KilnError, is_disk_full

MAX_MEMBERS = 64
CHUNK = 1 << 20
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


def invalid(message: str, hint: str = "") -> KilnError:
    return KilnError("adapter_upload_invalid", f"archive: {message}", status=400, field="archive",
                     hint=hint or "send a tar.gz of a PEFT adapter folder: adapter_config.json and "
                                  "adapter_model.safetensors, regular files only")


def too_large(limit: int, what: str) -> KilnError:
    return KilnError("adapter_upload_too_large", f"archive: {what} exceeds the upload quota of {limit} bytes",
                     status=413, field="archive", hint="raise KILN_MAX_ADAPTER_UPLOAD_BYTES "
                     "([server] max_adapter_upload_bytes), or upload a smaller adapter")


def _parts(name: str) -> tuple[str, ...]:
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        raise invalid(f"member {name!r} has an absolute or unsafe path")
    path = PurePosixPath(name)
    parts = tuple(p for p in path.parts if p != ".")
    if ".." in parts:
        raise invalid(f"member {name!r} leaves the adapter folder ('..')")
    return parts


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return "a symbolic link"
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a FIFO"
    if member.issparse():
        return "a sparse file"
    return "not a regular file"


def unpack_upload(fileobj, staging: Path, *, max_bytes: int) -> dict[str, Path]:
    """Unpack a (gzip) tar stream into numbered parts under `staging`; return {file name: part}.

    The archive holds the files flat, or inside one top-level folder (as `tar czf a.tgz name/` makes)."""
    staging = Path(staging)
    members: list[tuple[tuple[str, ...], Path]] = []
    total = 0
    try:
        with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
            for member in tar:
                parts = _parts(member.name)
                if member.isdir():
                    if len(parts) > 1:
                        raise invalid(f"member {member.name!r}: an adapter folder has no sub-folders")
                    continue
                if not member.isreg() or member.issparse():
                    raise invalid(f"member {member.name!r} is {_kind(member)}; only regular files are accepted")
                if not parts:
                    raise invalid(f"member {member.name!r} has no file name")
                if len(members) >= MAX_MEMBERS:
                    raise invalid(f"more than {MAX_MEMBERS} files")
                total += member.size
                if total > max_bytes:
                    raise too_large(max_bytes, "the unpacked adapter")
                part = staging / f".part-{len(members):04d}"
                source = tar.extractfile(member)
                copied = 0
                with open(part, "xb") as out:
                    while chunk := source.read(CHUNK):
                        copied += len(chunk)
                        if copied > member.size:
                            raise invalid(f"member {member.name!r} is longer than its header says")
                        out.write(chunk)
                members.append((parts, part))
    except tarfile.TarError as exc:
        raise invalid(f"not a readable tar archive ({exc})") from None
    except (EOFError, zlib.error, OSError) as exc:
        if is_disk_full(exc):  # the server's fault, not the archive's
            raise KilnError(DISK_FULL_CODE, f"the server's disk has no room to unpack the archive ({exc})",
                            status=507, hint=DISK_FULL_HINT) from None
        raise invalid(f"the archive is truncated or corrupt ({type(exc).__name__}: {exc})") from None
    if not members:
        raise invalid("the archive holds no files")
    tops = {parts[0] for parts, _ in members if len(parts) > 1}
    if any(len(parts) > 2 for parts, _ in members) or (tops and (len(tops) > 1
                                                                or any(len(p) == 1 for p, _ in members))):
        raise invalid("the files must lie flat, or inside one top-level folder")
    files: dict[str, Path] = {}
    for parts, part in members:
        name = parts[-1]
        if not _SAFE_NAME.match(name):
            raise invalid(f"file name {name!r} is not allowed (letters, digits, '.', '_' and '-'; not hidden)")
        if name in files:
            raise invalid(f"{name!r} appears twice")
        files[name] = part
    return files


def tar_gz_stream(root: Path, files: list[str], *, folder: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
    """A gzip tar of `root`'s named files under `folder/`, produced chunk by chunk (never whole in
    memory). A file whose size changed while it was read stops the stream with an OSError."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: the gzip container
    root = Path(root)
    folder_info = tarfile.TarInfo(folder)
    folder_info.type, folder_info.mode = tarfile.DIRTYPE, 0o755
    yield compressor.compress(folder_info.tobuf(format=tarfile.PAX_FORMAT))
    for name in files:
        path = root / name
        with open(path, "rb") as fh:
            stat = path.stat()
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size, info.mtime, info.mode = stat.st_size, int(stat.st_mtime), 0o644
            out = compressor.compress(info.tobuf(format=tarfile.PAX_FORMAT))
            if out:
                yield out
            remaining = stat.st_size
            while remaining:
                chunk = fh.read(min(chunk_size, remaining))
                if not chunk:
                    raise OSError(f"{path} shrank while it was archived")
                remaining -= len(chunk)
                out = compressor.compress(chunk)
                if out:
                    yield out
        padding = (-stat.st_size) % tarfile.BLOCKSIZE
        if padding:
            yield compressor.compress(b"\0" * padding)
    yield compressor.compress(b"\0" * (2 * tarfile.BLOCKSIZE)) + compressor.flush()
