"""The package version, in a leaf module: the writer records it, the CLI prints it, neither loads
the rest."""

__version__ = "0.1.0"
