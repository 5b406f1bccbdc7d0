// The avx2 build of the kernels; flags for it are set in csrc/CMakeLists.txt.
#include <algorithm>
#define HORA_KERNEL_NS kernels_avx2
#define HORA_KERNEL_NAME "avx2"
#include "hora/algo/kernels/kernel_body.inc"
