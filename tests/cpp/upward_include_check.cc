// Compiled as if it were part of the algo layer: the include below reaches
// up into core, which the layer's include tree does not contain.
#include "hora/core/message.h"

namespace hora {
int UpwardIncludeCheck() { return static_cast<int>(sizeof(Request)); }
}  // namespace hora
