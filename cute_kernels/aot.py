"""`python -m cute_kernels.aot --out build/aot`: ahead-of-time kernels; the code is in toolchain/aot.py."""
import sys

from cute_kernels.hopper.families import selected_variants
from cute_kernels.toolchain.aot import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], selected_variants))
