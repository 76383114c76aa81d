"""Defaults shared by every entry point (CLI, library, speed bench), defined once. Standard library only, so the
CLI can use them as option defaults without importing the models."""

from __future__ import annotations

# GPU memory kept free on top of the modelled peak by plan, estimate, check and the speed bench: CUDA allocator
# fragmentation and framework buffers the memory model does not count; `--headroom-gib` changes it.
DEFAULT_HEADROOM_GIB = 2.0
