#include "kernels/aten.h"

#include "kernels/layer_norm_grad.h"

#include <stdexcept>
#include <string>

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace zt::kernels {

bool dtype_supported(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

bool runs_on(const at::Tensor& t) { return kernels_available() && t.is_cuda() && dtype_supported(t.scalar_type()); }

DType dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kF32;
    case at::kBFloat16: return DType::kBF16;
    case at::kHalf: return DType::kF16;
    default: throw std::invalid_argument(std::string("zerotrain's kernels take fp32, bf16 or fp16, not ") + c10::toString(t));
  }
}

cudaStream_t current_stream(c10::Device device) {
#ifdef ZT_WITH_CUDA
  return at::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  (void)device;
  return nullptr;
#endif
}

std::pair<at::Tensor, at::Tensor> norm_param_grads(const at::Tensor& g, const at::Tensor& x2, const at::Tensor& mean,
                                                   const at::Tensor& rstd, bool need_w, bool need_b) {
  const int64_t C = x2.size(1);
  at::Tensor dw, db;
  LayerNormParamGradArgs a;
  a.grad_out = g.data_ptr();
  a.input = x2.data_ptr();
  a.mean = mean.data_ptr<float>();
  a.rstd = rstd.data_ptr<float>();
  a.type = dtype_of(x2.scalar_type());
  a.rows = x2.size(0);
  a.cols = C;
  if (need_w) {
    dw = at::empty({C}, x2.options());
    a.grad_weight = dw.data_ptr();
  }
  if (need_b) {
    db = at::empty({C}, x2.options());
    a.grad_bias = db.data_ptr();
  }
  auto ws = at::empty({layer_norm_param_grad_workspace_floats(a.rows, C)}, x2.options().dtype(at::kFloat));
  a.workspace = ws.data_ptr<float>();
  layer_norm_param_grads(a, current_stream(g.device()));
  return {dw, db};
}

}  // namespace zt::kernels
