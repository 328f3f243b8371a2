"""From a source to model inputs: sources, cleaning and splits, the tokenizer, the one batcher
and streaming. No Lightning and no model files: the DataModule that glues these to Lightning
lives in :mod:`docclass.train.datamodule`, model files in :mod:`docclass.artifacts`."""
