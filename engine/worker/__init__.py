"""Running the model on a device: inputs of a step, the forward pass, sampling."""
