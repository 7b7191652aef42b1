/* What every ahead-of-time exported kernel family shares: the ABI version the Python loader checks
 * (toolchain/aot_manifest.py ABI_VERSION) and the error code of a launch before its load. */
#pragma once
#include <stdint.h>

#define CUTE_AOT_ABI 1
#define CUTE_AOT_NOT_LOADED (-1) /* launch before a successful load */
