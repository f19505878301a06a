"""The package version: a leaf module, so that any module can read it without importing the
package (whose ``__init__`` imports most of them)."""

__version__ = "0.1.0"
