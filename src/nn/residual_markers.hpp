// The two marker layers a residual block (output = input + branch(input)) is flattened into, private to src/nn: the
// Model lays a block out as [opening marker, the branch's layers..., closing marker] in its one sequence of layers, so
// the parameters stay in forward order and the backward pass still completes a suffix of the gradients after each
// layer. The markers hold no parameters; the Model binds them to the block's input activation and to the skip
// gradient buffer (its own, not the backward ping-pong scratch: the branch's backward overwrites that).
#pragma once

#include <string>

#include "hpctrain/nn/layer.hpp"

namespace hpctrain::nn_detail {

// Opens a block. Forward: its output is its input (the Model gives it no buffer of its own: the branch reads the
// block's input in place). Backward: the branch's input gradient arrives as dy, and dx = dy + the skip gradient,
// written over dy.
class ResidualOpen final : public Layer {
 public:
  ResidualOpen(std::string name, const SampleShape& shape) : Layer(std::move(name), shape, shape) {}
  [[nodiscard]] std::string type() const override { return "residual"; }
  [[nodiscard]] bool in_place_backward() const override { return true; }
  [[nodiscard]] bool takes_any_layout() const override { return true; }
  // Generation: the new positions' rows of the block's input, branch output and sum all start their buffers.
  [[nodiscard]] IncrementalDecoding incremental_decoding(const Backend&) const override {
    return IncrementalDecoding::position_wise;
  }
  void bind_skip_gradient(void* skip) { skip_ = skip; }

  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    if (y.data != x.data) context.backend->copy(y.data, x.data, x.bytes());  // the Model aliases them
  }
  void backward(const StepContext& context, std::uint32_t, const TensorView&, const TensorView&, const TensorView& dy,
                const TensorView& dx, bool) override {
    context.backend->add(dy, {skip_, dy.dtype, dy.rows, dy.cols}, dx);
  }

 private:
  void* skip_ = nullptr;  // (rows, width) activation dtype: the closing marker's dy
};

// Closes a block. Forward: y = branch output + the block's input, unless the branch's last layer (a linear or
// attention layer) wrote that sum in its product (Layer::forward_residual, chosen by the Model): then the Model does
// not run this forward, and the branch output has no buffer. Backward: dy goes on into the branch unchanged (dx = dy,
// no copy) and is kept as the skip gradient for the opening marker (a copy: the branch's backward overwrites dy's
// ping-pong buffer).
class ResidualClose final : public Layer {
 public:
  ResidualClose(std::string name, const SampleShape& shape) : Layer(std::move(name), shape, shape) {}
  [[nodiscard]] std::string type() const override { return "add"; }
  [[nodiscard]] bool in_place_backward() const override { return true; }
  [[nodiscard]] bool takes_any_layout() const override { return true; }
  // Generation: the new positions' rows of the block's input, branch output and sum all start their buffers.
  [[nodiscard]] IncrementalDecoding incremental_decoding(const Backend&) const override {
    return IncrementalDecoding::position_wise;
  }
  // block_input: the activation the opening marker read, (max_rows, width); skip: the skip gradient buffer.
  void bind_block(void* block_input, void* skip) {
    block_input_ = block_input;
    skip_ = skip;
  }

  void forward(const StepContext& context, std::uint32_t, const TensorView& x, const TensorView& y) override {
    context.backend->add(x, {block_input_, x.dtype, x.rows, x.cols}, y);
  }
  void backward(const StepContext& context, std::uint32_t, const TensorView&, const TensorView&, const TensorView& dy,
                const TensorView&, bool) override {
    context.backend->copy(skip_, dy.data, dy.bytes());
  }

 private:
  void* block_input_ = nullptr;
  void* skip_ = nullptr;
};

}  // namespace hpctrain::nn_detail
