"""The network, torch only: attention building blocks and the classifier. No Lightning, no files,
no tokenizer: these modules can be read, tested and reused alone."""
