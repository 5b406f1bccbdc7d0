// The generic build of the kernels; flags for it are set in csrc/CMakeLists.txt.
#include <algorithm>
#define HORA_KERNEL_NS kernels_generic
#define HORA_KERNEL_NAME "generic"
#include "hora/algo/kernels/kernel_body.inc"
