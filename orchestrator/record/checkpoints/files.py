"""Where a trial's checkpoints live, how one is written and read, and which is a trial's latest.

A checkpoint is one artifact of Optuna's artifact stores (`optuna.artifacts`): a file in a folder
laid out as Optuna's `FileSystemArtifactStore` lays it, each written whole (`FolderStore`; by
default a folder beside an SQLite file: `study.db` keeps them in `study-artifacts/`; a shared
folder on a cluster; `place.py` checks what `--artifacts` names), or an object in S3 or GCS
through Optuna's own `Boto3ArtifactStore` and `GCSArtifactStore` (`--artifacts s3://bucket`,
`gs://bucket`). Each one
is listed with its trial as Optuna lists an uploaded artifact, and the trial's user attribute
`checkpoint` = {"artifact_id", "epoch"} names its latest, so any process on any node can find it.

The file is `torch.save` of {"epoch", "state"} when torch is loaded, read back with
`weights_only=True` (a folder shared by many users must not run code when a file is read), and
JSON for an adapter that uses no torch. It holds only what the adapter saved: never the storage
URL, never a password. A file that cannot be read is reported as unreadable, never believed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.imports import LazyImport
from orchestrator.record.checkpoints import place
from orchestrator.record.store.location import StorageLocation
from orchestrator.record.store.optuna_private import rdb_storage_of, storage_of
from orchestrator.record.study.spec import load_spec
from orchestrator.record.trials import attr_names as names

if TYPE_CHECKING:
    import optuna
    import torch
    from optuna import artifacts
else:
    artifacts = LazyImport("optuna.artifacts")
    torch = LazyImport("torch")

# What a checkpoint file starts with: a torch.save file is a zip archive.
_ZIP_MAGIC = b"PK"


@dataclass(frozen=True)
class Checkpoint:
    """A saved state: the trial that saved it, its artifact, and the epoch it was saved after."""

    trial: int
    artifact_id: str
    epoch: int


class CheckpointUnreadable(Exception):
    """A checkpoint that is missing, cut short or not ours: a trial starts afresh (and
    `orchestrator.load_checkpoint` raises it, saying which file and why)."""


# --- where they live --------------------------------------------------------------------------


def default_location(storage: StorageLocation) -> str | None:
    """Beside an SQLite file: `DIR/NAME-artifacts` for `DIR/NAME.db`. None for a database server
    (its trials may run on any node: only the user knows a folder they all share)."""
    path = storage.sqlite_path
    if path is None:
        return None
    return str(path.with_name(f"{path.stem}-artifacts"))


def location_problem(location: str) -> str | None:
    """Why `--artifacts` is refused, in words (never showing a secret); None when accepted."""
    try:
        place.checked_location(location)
    except UserError as error:
        return str(error)
    return None


def check_location(location: str | None) -> str | None:
    """`--artifacts` as stored (a folder made absolute), or a UserError saying why not."""
    return None if location is None else place.checked_location(location)


def open_store(location: str) -> Any:
    """Optuna's artifact store for a location: a folder (made if missing), S3 or GCS."""
    scheme, sep, rest = location.partition("://")
    if sep and scheme == "s3":
        return artifacts.Boto3ArtifactStore(rest.strip("/"))
    if sep and scheme == "gs":
        return artifacts.GCSArtifactStore(rest.strip("/"))
    return FolderStore(Path(rest if sep else location))


class FolderStore:
    """Optuna's `FileSystemArtifactStore`, writing each file whole: to a hidden `.partial` name,
    synced, then renamed (a rename within a folder is atomic), so a full or failing disk leaves
    no cut file under a checkpoint's name, and no partial one behind. The folder is made at
    each write when missing (it may have been unmounted or removed since the last)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        with contextlib.suppress(OSError):  # said at the first write, which tries again
            folder.mkdir(parents=True, exist_ok=True)
        self._optuna = artifacts.FileSystemArtifactStore(folder)

    def open_reader(self, artifact_id: str) -> Any:
        return self._optuna.open_reader(artifact_id)

    def remove(self, artifact_id: str) -> None:
        self._optuna.remove(artifact_id)

    def write(self, artifact_id: str, content_body: Any) -> None:
        if Path(artifact_id).name != artifact_id or artifact_id.startswith("."):
            raise ValueError(f"Invalid artifact_id: {artifact_id}")
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.folder / f".{artifact_id}.partial"
        try:
            with open(partial, "wb") as out:
                shutil.copyfileobj(content_body, out)
                out.flush()
                os.fsync(out.fileno())  # on disk before it is named: a crash leaves no cut file
            os.replace(partial, self.folder / artifact_id)
        except BaseException:
            with contextlib.suppress(OSError):
                partial.unlink()
            raise


def where(location: str, artifact_id: str) -> str:
    """A checkpoint's address in words a user can copy: its file, or its object's URL."""
    scheme, sep, rest = location.partition("://")
    if sep and scheme in ("s3", "gs"):
        return f"{scheme}://{rest.strip('/')}/{artifact_id}"
    return str((Path(rest if sep else location) / artifact_id).absolute())


def study_location(study: optuna.Study) -> str | None:
    """Where this study keeps its checkpoints: `--artifacts` as stored, or beside its SQLite file."""
    spec = load_spec(study)
    if spec is not None and spec.artifacts:
        return spec.artifacts
    backend = rdb_storage_of(storage_of(study))
    stored_at = getattr(backend, "location", None)  # set by create_storage
    if stored_at is None:
        url = getattr(backend, "url", None)
        if url is None:
            return None
        # A study the caller opened with plain Optuna: its storage knows only its URL.
        stored_at = StorageLocation.parse(str(url))
    return default_location(stored_at)


# --- a trial's latest ------------------------------------------------------------------------


def recorded(trial: optuna.trial.FrozenTrial) -> Checkpoint | None:
    """The checkpoint a trial's `checkpoint` attribute names, if it is well formed."""
    value = trial.user_attrs.get(names.CHECKPOINT)
    if not isinstance(value, dict):
        return None
    artifact_id, epoch = value.get("artifact_id"), value.get("epoch")
    if not isinstance(artifact_id, str) or not isinstance(epoch, int) or epoch < 0:
        return None
    return Checkpoint(trial.number, artifact_id, epoch)


def latest(study: optuna.Study, trial_number: int, *, follow: bool = True) -> Checkpoint | None:
    """The latest checkpoint of trial `trial_number`; with `follow`, when it saved none, that of
    the trial it resumed from (its `checkpoint_from`), and so on back: a re-run lost before its
    first save hands on what its own source saved."""
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    seen: set[int] = set()
    number: Any = trial_number
    while isinstance(number, int) and number in by_number and number not in seen:
        seen.add(number)
        trial = by_number[number]
        found = recorded(trial)
        if found is not None or not follow:
            return found
        number = trial.user_attrs.get(names.CHECKPOINT_FROM)
    return None


# --- the file ---------------------------------------------------------------------------------


def encode(epoch: int, state: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint: torch.save when torch is loaded (tensors as they are), else JSON."""
    payload = {"epoch": int(epoch), "state": state}
    if "torch" in sys.modules:  # an adapter without torch never pays for importing it
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        return buffer.getvalue()
    return json.dumps(payload).encode()


def decode(data: bytes) -> tuple[int, dict[str, Any]]:
    """(epoch, state) of a checkpoint's bytes, or CheckpointUnreadable saying why not."""
    try:
        if data.startswith(_ZIP_MAGIC):
            # weights_only: tensors, numbers, strings and containers, never code to run.
            payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        else:
            payload = json.loads(data.decode())
    except Exception as error:  # a cut or foreign file: whatever the reader says, it is unread
        raise CheckpointUnreadable(f"{type(error).__name__}: {str(error)[:120]}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("state"), dict):
        raise CheckpointUnreadable("it holds no saved state")
    epoch = payload.get("epoch")
    if not isinstance(epoch, int) or epoch < 0:
        raise CheckpointUnreadable("it names no epoch")
    return epoch, payload["state"]


def read(store: Any, checkpoint: Checkpoint) -> dict[str, Any]:
    """The state saved in `checkpoint`, or CheckpointUnreadable (missing, cut short, not ours,
    or saved at another epoch than its trial recorded)."""
    try:
        with store.open_reader(checkpoint.artifact_id) as reader:
            data = reader.read()
    except Exception as error:  # not found, a bucket away, no permission: not there for us
        raise CheckpointUnreadable(f"{type(error).__name__}: {str(error)[:120]}") from None
    epoch, state = decode(data)
    if epoch != checkpoint.epoch:
        raise CheckpointUnreadable(f"it was saved at epoch {epoch}, not {checkpoint.epoch}")
    return state


def read_file(path: str | os.PathLike[str]) -> tuple[int, dict[str, Any]]:
    """(epoch, state) of a checkpoint file on this machine (the one `best` names), or
    CheckpointUnreadable naming the file and why."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        why = os.strerror(error.errno) if error.errno else type(error).__name__
        raise CheckpointUnreadable(f"checkpoint {path} cannot be read: {why}") from None
    try:
        return decode(data)
    except CheckpointUnreadable as why:
        raise CheckpointUnreadable(
            f"checkpoint {path} is cut short or not one this tool saved ({why})"
        ) from None


def remove(store: Any, artifact_id: str) -> None:
    """Drop one checkpoint; one already gone is fine (another process may have tidied it)."""
    # Gone already, or the store refuses: disk is tidied on a best effort.
    with contextlib.suppress(Exception):
        store.remove(artifact_id)
