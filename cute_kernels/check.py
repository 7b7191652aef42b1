"""`python -m cute_kernels.check`: the sm_90a compile check; the code is in toolchain/check.py."""
import sys

from cute_kernels.hopper.families import selected_variants
from cute_kernels.toolchain.check import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], selected_variants))
