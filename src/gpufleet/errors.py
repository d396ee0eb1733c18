"""One exception tree for gpufleet.

Every third-party error is translated at its boundary (``raise ... from``) into one of these, so
the CLI can print one clear line (and exit with a meaningful code) instead of a traceback.
"""

from __future__ import annotations


class GpufleetError(Exception):
    """Base of every error gpufleet raises on purpose. ``exit_code`` is what the CLI returns."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class UsageError(GpufleetError):
    """The user asked for something that cannot be done as asked (bad option, bad spec)."""

    exit_code = 2


class ConfigError(UsageError):
    """A file or value the user supplied is invalid; the message names the file, field or line."""


class CatalogError(GpufleetError):
    """The packaged catalog data is inconsistent or a lookup failed."""


class UnknownNameError(UsageError):
    """A name (model, profile, test, ...) is not known; carries did-you-mean suggestions."""

    def __init__(self, kind: str, name: str, known: list[str] | tuple[str, ...]) -> None:
        import difflib

        self.kind = kind
        self.name = name
        self.suggestions = difflib.get_close_matches(name.lower(), [k.lower() for k in known], 3)
        hint = (
            f"did you mean {', '.join(repr(s) for s in self.suggestions)}?"
            if self.suggestions
            else None
        )
        super().__init__(f"unknown {kind} {name!r}", hint=hint)


class NoDeviceError(GpufleetError):
    """No GPU (or no NVML) was found and no simulated or imported fleet was given."""

    exit_code = 2


class DeviceError(GpufleetError):
    """A device-layer call failed in a way the caller has to handle."""


class GpuLostError(DeviceError):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST); every further call on it fails."""


class ParseError(ConfigError):
    """An input document (nvidia-smi XML/CSV, spec file) could not be parsed.

    ``source`` names the file; ``where`` the element, field or line.
    """

    def __init__(self, source: str, where: str, problem: str) -> None:
        self.source = source
        self.where = where
        self.problem = problem
        super().__init__(f"{source}: {where}: {problem}")
