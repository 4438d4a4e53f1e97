"""The ``etptr-bench`` command: etptr's host<->GPU clones against CuPy, torch and the
pinned line rate, on a safetensors checkpoint or across transfer sizes.

Run ``etptr-bench --help`` or ``python -m etptr.bench --help``. The modules
here are private; the command line and its ``--json`` output are the interface.
"""
