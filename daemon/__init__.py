"""The per-node Phalanx supervisor. Never imports torch."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("phalanx")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
