// Subcommands whose implementation has not landed yet say so (removed as each lands).
#include <cstdio>
#include "cli/commands.h"
namespace zt::cli {
int cmd_check_config(int, char**) { std::fprintf(stderr, "check-config: not built yet\n"); return 2; }
int cmd_train(int, char**) { std::fprintf(stderr, "train: not built yet\n"); return 2; }
int cmd_bench_adam(int, char**) { std::fprintf(stderr, "bench adam: not built yet\n"); return 2; }
int cmd_launch(int, char**) { std::fprintf(stderr, "launch: not built yet\n"); return 2; }
}  // namespace zt::cli
