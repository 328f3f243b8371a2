"""Word scores: the one path from texts to model inputs for a trained classifier, the word-score
methods behind one registry, and the per-document explanation record with its JSONL."""
