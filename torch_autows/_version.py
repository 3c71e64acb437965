"""The package version, in a module of its own so that no module of the package imports it from the
package ``__init__`` (an import upward); setup.cfg reads it statically (``attr:``)."""
from __future__ import annotations

__version__ = "0.1.0"
