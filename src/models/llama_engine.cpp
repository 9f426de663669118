#include "models/llama_engine.h"

#include "models/hf_llama.h"
#include "zerotrain/error.h"

namespace zt::models {

void llama_engine_options(const LlamaForCausalLM& model, EngineOptions& eo,
                          std::shared_ptr<const HfCheckpointReader> init_from) {
  auto m = model.ptr();
  eo.units.clear();
  eo.unit_names.clear();
  const auto layers = m->decoder_layers();
  for (size_t i = 0; i < layers.size(); ++i) {
    eo.units.push_back(layers[i]->parameters());
    eo.unit_names.push_back("model.layers." + std::to_string(i));
  }
  eo.param_shape = [m](const std::string& n) { return m->param_shape(n); };
  if (init_from) {
    load_hf_llama(*m, *init_from);  // checks every name and shape; loads the real parameters
    eo.param_init = [init_from](const std::string& n, torch::Tensor& t) {
      torch::NoGradGuard no_grad;
      t.copy_(init_from->read(n));
    };
  } else {
    eo.param_init = [m](const std::string& n, torch::Tensor& t) { m->init_parameter(n, t); };
  }
}

void attach_llama_engine(LlamaForCausalLMImpl& model, Engine& engine) {
  Engine* e = &engine;
  model.set_layer_runner([e](int64_t layer, const CheckpointFn& fn, const torch::Tensor& x) {
    return e->run_unit(static_cast<int>(layer), fn, x);
  });
}

}  // namespace zt::models
