"""Type stubs for etptr._core._metadata: ExecuTorch's sizes / dim_order / strides rules."""
from typing import Any, final

@final
class Metadata:
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
