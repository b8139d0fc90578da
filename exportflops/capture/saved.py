"""Programs saved with ``torch.export.save``, read back: the cause of a failed read kept, and a
file saved by another torch named as such."""

from __future__ import annotations

import json
import logging
import os
import zipfile

import torch

from .hints import first_lines
from ..torch_internals import require


def load(path: str | os.PathLike) -> torch.export.ExportedProgram:
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        raise FileNotFoundError(
            f"no saved program at {os.fspath(path)!r}, which {what}: pass the path of a file "
            f"written by torch.export.save(program, path), or the model itself."
        )
    # torch logs the real cause of a failed load as a warning and raises "check the warnings
    # above", which a command that hides torch's log never shows: the cause is kept here.
    causes = _LogRecords()
    logger = logging.getLogger("torch.export")
    logger.addHandler(causes)
    try:
        return torch.export.load(path)
    except Exception as error:
        newer = _version_mismatch(path)
        if newer is not None:
            raise ValueError(f"{os.fspath(path)!r} was saved by another torch: {newer}. This is "
                             f"torch {torch.__version__}: re-export and save the model with it, "
                             f"or analyze with the torch that saved it.") from error
        cause = causes.last() or first_lines(error)
        raise ValueError(
            f"{os.fspath(path)!r} is not a program saved with torch.export.save "
            f"(torch.export.load: {type(error).__name__}: {cause}). A checkpoint "
            f"written by torch.save (weights or a pickled model) is not a program: build the "
            f"model and analyze it, or save one with "
            f"torch.export.save(torch.export.export(model, args), path)."
        ) from error
    finally:
        logger.removeHandler(causes)


class _LogRecords(logging.Handler):
    """Keeps the last line of what torch logged (the deserializer's real error)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def last(self) -> str:
        for record in reversed(self.records):
            if record.exc_info and record.exc_info[1] is not None:
                error = record.exc_info[1]
                return f"{type(error).__name__}: {first_lines(error, 3)}"
        return ""


def _version_mismatch(path: str | os.PathLike) -> str | None:
    """What differs between the archive's versions and this torch's, or None."""
    SCHEMA_VERSION = require("export_schema_version")
    try:
        with zipfile.ZipFile(path) as archive:
            saved = {name.rpartition("/")[2]: archive.read(name) for name in archive.namelist()
                     if name.endswith(("archive_version", "models/model.json"))}
    except (OSError, zipfile.BadZipFile):
        return None
    archive_version = saved.get("archive_version", b"0").decode().strip()
    if archive_version != "0":
        return f"archive version {archive_version} (this torch reads version 0)"
    try:
        schema = json.loads(saved.get("model.json", b"{}")).get("schema_version", {})
    except ValueError:
        return None
    major = schema.get("major")
    if major is not None and major != SCHEMA_VERSION[0]:
        return (f"export schema {major}.{schema.get('minor')} (this torch reads "
                f"{SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]})")
    return None
