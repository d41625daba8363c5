"""The JAX backend of the Keras adapter: Keras 3 models on the JAX backend."""
