"""berth: an unprivileged, enroot-compatible container runtime."""

__version__ = "0.1.0"
