"""Training a DFlash draft for a target."""
