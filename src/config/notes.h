// Keys zerotrain accepts whose effect differs from DeepSpeed's ([Config Notes]).
//
// [Config Notes]
//  * A DeepSpeed key that only tunes DeepSpeed's own implementation (bucket layout, I/O
//    pipelining, optimizer back ends, timers) changes no result: zerotrain accepts it,
//    and when it is set to a value other than DeepSpeed's default, says in one line what
//    zerotrain does instead. Nothing is accepted and ignored without a word; a key that
//    would change a result and is not implemented is refused (config/support.cpp).
//  * The notes are computed from the raw JSON (a key counts as set only when it is
//    present) and the resolved config (the stage decides what overlap_comm means).
//  * `zerotrain check-config` lists them on stderr, `zerotrain train` prints them on rank 0
//    before the first step; docs/config.md has the list.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace zt {
struct Config;
}

namespace zt::config {

// One line per such key: "PATH = VALUE: what zerotrain does instead".
std::vector<std::string> config_notes(const nlohmann::json& raw, const Config& c);

}  // namespace zt::config
