// Llama on zerotrain's engine: one ZeRO-3 gather unit per decoder layer, partitioned
// construction, and initialisation from a Hugging Face checkpoint.
//
//   LlamaConfig c = ...; c.deferred_init = stage == 3;   // placeholders: never whole
//   LlamaForCausalLM m(c);
//   EngineOptions eo;
//   llama_engine_options(m, eo, ckpt);   // units, param_shape, param_init (from ckpt)
//   auto engine = initialize(m.ptr(), cfg, eo);
//   attach_llama_engine(*m, *engine);    // layers run through Engine::run_unit
//   ... train ...
//   m->set_layer_runner({});             // before the engine goes
//
// With a checkpoint, each placeholder is read from it when the engine materialises it
// (at ZeRO-3 one unit at a time, on the device, keeping only the rank's shard; at stages
// 0-2 one tensor at a time): the model is never held twice, nor whole at ZeRO-3.
// Non-placeholder parameters (RMSNorm weights, or all of a model built without
// deferred_init) are loaded by llama_engine_options itself.
#pragma once
#include <memory>

#include "hf_checkpoint.h"  // sibling-relative
#include "llama.h"
#include "zerotrain/engine.h"

namespace zt::models {

// units / unit_names ("model.layers.N"), param_shape, param_init. `init_from` (may be
// null): checked against the config (check_hf_llama) and used for every parameter.
void llama_engine_options(const LlamaForCausalLM& model, EngineOptions& eo,
                          std::shared_ptr<const HfCheckpointReader> init_from = nullptr);

// The model's layers run as the engine's units (Engine::run_unit; a no-op wrapper at
// stages 0-2). The engine must outlive the model's forwards until
// model.set_layer_runner({}).
void attach_llama_engine(LlamaForCausalLMImpl& model, Engine& engine);

}  // namespace zt::models
