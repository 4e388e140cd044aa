"""Kernel ABI (c7x_kernels.h), host C reference kernels and their numpy twin."""
