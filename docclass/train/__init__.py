"""Training: the LightningModule, callbacks, the LightningCLI set-up and checkpoint I/O."""
