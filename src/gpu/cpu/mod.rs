//! The CPU backend: the numerical reference for the GPU backends.
