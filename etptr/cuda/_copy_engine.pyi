"""Type stubs for etptr.cuda._copy_engine: settings and the copy pipeline."""
from typing import Any, TypedDict, final

class CopyConfigDict(TypedDict):
    """The copy engine's settings, as :func:`get_copy_config` returns them."""

    threads: int
    slot_bytes: int
    slots: int
    small_copy_bytes: int

def set_copy_config(
    *,
    threads: int | None = None,
    slot_bytes: int | None = None,
    slots: int | None = None,
    small_copy_bytes: int | None = None,
) -> None: ...
def get_copy_config() -> CopyConfigDict: ...
def _check_config(
    threads: int | None, slot_bytes: int | None, slots: int | None, small_copy_bytes: int | None
) -> dict[str, int]: ...
def _config_from_env() -> None: ...
def _push_config(
    threads: int | None = None,
    slot_bytes: int | None = None,
    slots: int | None = None,
    small_copy_bytes: int | None = None,
) -> object: ...
def _pop_config(key: object) -> None: ...
@final
class _Engine: ...
