"""The TensorFlow adapter: Keras 3 models on the TensorFlow backend."""
