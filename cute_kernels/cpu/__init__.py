"""The CPU backend's C kernels (csrc/), built with the system compiler on first use (build.py), and
their ctypes wrappers; each has the same contract as its torch reference in cute_kernels.reference."""
