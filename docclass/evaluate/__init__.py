"""How far the word scores can be trusted: erasure metrics (comprehensiveness, sufficiency, AOPC)
and sanity checks (leave-one-word-out, permuted pool, weight randomisation)."""
