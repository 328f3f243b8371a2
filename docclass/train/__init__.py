"""Training: the LightningModule, the DataModule, callbacks, the LightningCLI set-up and atomic
checkpoint writes."""
