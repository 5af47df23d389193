// std::mt19937's sequence, made a block at a time: the 624-word twist and the tempering of all 624 outputs as plain
// loops the compiler vectorises (std::mt19937 tempers one value per call), about twice as fast. For code that must
// reproduce PyTorch's CPU generator (torch.randperm: data/distributed_sampler.hpp) on every epoch.
#pragma once

#include <cstdint>

namespace hpctrain {

class Mt19937Blocks {
 public:
  static constexpr int block_size = 624;  // the generator's state words: outputs per block

  explicit Mt19937Blocks(std::uint32_t seed);
  // The next block_size outputs, exactly those of std::mt19937(seed)'s next block_size calls. Valid until the next
  // call.
  const std::uint32_t* next_block();

 private:
  alignas(64) std::uint32_t state_[block_size];
  alignas(64) std::uint32_t outputs_[block_size];
};

}  // namespace hpctrain
