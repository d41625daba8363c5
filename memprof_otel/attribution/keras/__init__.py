"""The Keras adapter, shared by the backends whose models are no ``torch.nn.Module``: TensorFlow
(``attribution/tensorflow/``) and JAX (``attribution/jax/``) each supply a ``KerasBackend``."""
