// The avx512 build of the kernels; flags for it are set in csrc/CMakeLists.txt.
#include <algorithm>
#define HORA_KERNEL_NS kernels_avx512
#define HORA_KERNEL_NAME "avx512"
#include "hora/algo/kernels/kernel_body.inc"
