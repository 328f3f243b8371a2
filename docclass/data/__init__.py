"""From a source to model inputs: sources, cleaning and splits, the tokenizer, the one batcher,
streaming, and the Lightning DataModule that glues them together."""
