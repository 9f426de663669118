// Subcommands whose implementation has not landed yet say so (removed as each lands).
#include <cstdio>
#include "cli/commands.h"
namespace zt::cli {
}  // namespace zt::cli
