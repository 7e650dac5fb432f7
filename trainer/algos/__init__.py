"""Pure tensor functions of the algorithms: advantages, policy and value losses, registered by name."""
