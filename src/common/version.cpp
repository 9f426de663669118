// The one library source that sees the generated version header (build/generated/,
// from cmake/version.h.in): it gets that include directory as a source property, so a
// version bump recompiles this file only.
#include "zerotrain/version.h"

#include "zerotrain_version.h"

namespace zt {

const char* version() { return ZT_VERSION; }

}  // namespace zt
