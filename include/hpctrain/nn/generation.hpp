// Autoregressive generation from a language model (hpctrain generate): the sampler (temperature, top-k, one
// counter-based draw per position) and the decoding loop, with the key/value cache of Model::forward_positions or, as
// the reference, the full forward over the window for every new token.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hpctrain {

class Backend;
class Model;

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (the largest logit)
  std::int64_t top_k = 0;    // keep the k largest logits; 0: the whole vocabulary
  std::uint64_t seed = 0;
};

// The distribution the token after `logits` (vocabulary values) is drawn from, in double: softmax(logits /
// temperature) over the top_k largest logits (ties: the lower id first), zero elsewhere; at temperature 0 all mass on
// the largest logit (the lowest id among equals). Throws Error for a non-finite logit.
std::vector<double> sampling_distribution(const float* logits, std::int64_t vocabulary, const SamplingOptions& options);

// The token at absolute position `position` of the generated sequence: the first id whose cumulative probability
// (ids in increasing order) exceeds u, u the counter-based uniform of (seed, position) (RngPurpose::token_sampling).
// The draw is a function of the logits, the options and the position only: the same on any machine and rank count.
std::int32_t sample_token(const float* logits, std::int64_t vocabulary, const SamplingOptions& options,
                          std::uint64_t position);

enum class DecodingPath {
  cached,      // Model::forward_positions: the prompt once, then one position per token
  recomputed,  // Model::forward on the whole window (zero-padded to T) for every token
};

// Generates from a model whose first layer is an embedding and whose output is (T, classes): ids of one sample.
class TokenGenerator {
 public:
  // The model must be built with ModelBuffers{max_rows >= 1, decoding = true} (decoding only for the cached path).
  TokenGenerator(Model& model, Backend& backend);
  // Why the cached path cannot run this model on its backend ("" when it can): the first layer without incremental
  // decoding.
  [[nodiscard]] std::string cache_unavailable_reason() const;
  // prompt + max_new_tokens sampled ids; on_token(id) after each new one. The window the model sees is the last T ids
  // (a longer sequence drops its oldest ids, as nanoGPT does); once it slides, every position shifts, so the cached
  // path recomputes the window (as the uncached one always does).
  std::vector<std::int32_t> generate(const std::vector<std::int32_t>& prompt, std::int64_t max_new_tokens,
                                     const SamplingOptions& options, DecodingPath path,
                                     const std::function<void(std::int32_t)>& on_token);

 private:
  Model& model_;
  Backend& backend_;
};

}  // namespace hpctrain
