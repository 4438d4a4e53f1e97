"""Type stubs for etptr._core._args: the integer argument reader (C level only)."""
