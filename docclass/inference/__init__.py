"""Using a trained model: ``DocClassifier`` (load / predict / explain), bulk classification,
the HTTP server, and the report pipeline (documents → explanations → faithfulness → pages)."""
