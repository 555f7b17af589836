"""dsahal-example-plugin: the smallest complete dsahal backend plugin (see README.md)."""

__version__ = "0.1.0"
