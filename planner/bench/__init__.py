"""The torch.distributed benchmark (torch imported lazily, only here)."""


def need_torch() -> None:
    """A MissingDependencyError (exit 6) saying how to install torch, when it is not there."""
    try:
        import torch  # noqa: F401
    except ImportError:
        from planner.errors import MissingDependencyError

        raise MissingDependencyError(
            "torch is not installed: `pip install 'planner[bench]'` (torch==2.13.0) for bench and calibrate") from None
