"""Everything around the kernels that is not a kernel: the compile cache, the sm_90a compile check and
its SASS reader, ahead-of-time export / link / load / manifest, and where kernels come from (kernel_path)."""
