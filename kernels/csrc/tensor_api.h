// The parts of ATen the kernels use: at::Tensor with its methods, parallel_for and the
// dtype dispatch macros, and tensor creation (below). Not <ATen/ATen.h>, which declares
// every operator: parsing it took ~9 s of each file's compile, half the kernels' build
// time on 2 cores; these headers take ~3 s.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like_ops.h>
#include <ATen/ops/empty_ops.h>
#include <ATen/ops/zeros_ops.h>

// at::empty, at::zeros and at::empty_like as ATen/ops/{empty,zeros,empty_like}.h define
// them, whose headers would bring in ATen/Context.h (another ~3 s a file).
namespace tensors {

inline at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::_ops::empty_memory_format::call(
      c10::fromIntArrayRefSlow(sizes), c10::optTypeMetaToScalarType(options.dtype_opt()),
      options.layout_opt(), options.device_opt(), options.pinned_memory_opt(),
      options.memory_format_opt());
}

inline at::Tensor zeros(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::_ops::zeros::call(c10::fromIntArrayRefSlow(sizes),
                               c10::optTypeMetaToScalarType(options.dtype_opt()),
                               options.layout_opt(), options.device_opt(),
                               options.pinned_memory_opt());
}

inline at::Tensor empty_like(const at::Tensor& like) {
  return at::_ops::empty_like::call(like, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                                    std::nullopt);
}

}  // namespace tensors
