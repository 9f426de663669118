// The command line's LoRA spec: `zerotrain train --lora r=16,alpha=32,dropout=0.05,targets=q_proj|v_proj,rslora`.
//
//   r=N            rank (default 8)
//   alpha=X        lora_alpha (default: r, i.e. scaling 1)
//   dropout=X      lora_dropout in [0, 1) (default 0)
//   targets=A|B|C  target_modules names ([LoRA Targets] in lora.h); required unless regex= is given
//   regex=RE       target_modules as one full-match regex; must come last (it may hold ',' and '|')
//   rslora         scaling alpha / sqrt(r)
// Anything else is a ConfigError naming the item and listing the keys.
#pragma once
#include <string>

#include "lora/lora.h"

namespace zt::lora {

LoraOptions parse_lora_spec(const std::string& spec);

// The spec back as text (for logs and checkpoints' client state).
std::string lora_spec_string(const LoraOptions& o);

}  // namespace zt::lora
