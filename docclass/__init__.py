"""docclass: document classifiers whose decisions can be inspected word by word."""

__version__ = "0.1.0"
