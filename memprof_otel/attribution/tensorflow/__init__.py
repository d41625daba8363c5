"""The Keras adapter's TensorFlow backend: Keras 3 models on the TensorFlow backend."""
