"""docclass: document classifiers whose decisions can be inspected word by word."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Imported on first use: `import docclass` stays cheap for tools that only need the CLI.
    if name == "DocClassifier":
        from docclass.inference.classifier import DocClassifier

        return DocClassifier
    raise AttributeError(f"module 'docclass' has no attribute {name!r}")
