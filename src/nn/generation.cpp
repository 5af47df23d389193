// The sampler and the decoding loop of hpctrain generate.
#include "hpctrain/nn/generation.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/rng.hpp"
#include "hpctrain/kernels/backend_buffer.hpp"
#include "hpctrain/nn/model.hpp"

namespace hpctrain {

std::vector<double> sampling_distribution(const float* logits, std::int64_t vocabulary,
                                          const SamplingOptions& options) {
  HPCTRAIN_ASSERT(vocabulary > 0 && options.temperature >= 0.0 && options.top_k >= 0 && options.top_k <= vocabulary,
                  "sampling options (temperature " << options.temperature << ", top_k " << options.top_k
                                                   << ") for a vocabulary of " << vocabulary);
  for (std::int64_t id = 0; id < vocabulary; ++id)
    if (!std::isfinite(logits[id]))
      throw NumericsError("the model's logit of token " + std::to_string(id) + " is " + std::to_string(logits[id]),
                          "the checkpoint's parameters are not usable; generate from an earlier checkpoint");
  // Ids by decreasing logit, the lower id first among equals: the first top_k are kept.
  std::vector<std::int64_t> order(static_cast<std::size_t>(vocabulary));
  std::iota(order.begin(), order.end(), 0);
  const auto kept = static_cast<std::size_t>(options.temperature == 0.0 ? 1
                                             : options.top_k > 0        ? options.top_k
                                                                        : vocabulary);
  std::partial_sort(
      order.begin(), order.begin() + static_cast<std::ptrdiff_t>(kept), order.end(),
      [&](std::int64_t a, std::int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<double> probabilities(static_cast<std::size_t>(vocabulary), 0.0);
  if (kept == 1) {
    probabilities[static_cast<std::size_t>(order[0])] = 1.0;
    return probabilities;
  }
  const double largest = logits[order[0]];
  double total = 0.0;
  for (std::size_t i = 0; i < kept; ++i) {
    const auto id = static_cast<std::size_t>(order[i]);
    total += probabilities[id] = std::exp((static_cast<double>(logits[id]) - largest) / options.temperature);
  }
  for (double& probability : probabilities) probability /= total;
  return probabilities;
}

std::int32_t sample_token(const float* logits, std::int64_t vocabulary, const SamplingOptions& options,
                          std::uint64_t position) {
  const std::vector<double> probabilities = sampling_distribution(logits, vocabulary, options);
  const double u = random_uniform(options.seed, RngPurpose::token_sampling, 0, position);
  double cumulative = 0.0;
  std::int64_t last_possible = 0;
  for (std::int64_t id = 0; id < vocabulary; ++id) {
    if (probabilities[static_cast<std::size_t>(id)] == 0.0) continue;
    cumulative += probabilities[static_cast<std::size_t>(id)];
    last_possible = id;
    if (cumulative > u) return static_cast<std::int32_t>(id);
  }
  return static_cast<std::int32_t>(last_possible);  // u above a cumulative sum that rounding left below 1
}

TokenGenerator::TokenGenerator(Model& model, Backend& backend) : model_(model), backend_(backend) {
  HPCTRAIN_ASSERT(model.token_ids() != nullptr && model.positions() > 1, "generation needs a sequence model");
}

std::string TokenGenerator::cache_unavailable_reason() const {
  const Layer* layer = model_.layer_without_incremental_decoding();
  if (layer == nullptr) return "";
  return "layer '" + layer->name() + "' (" + layer->type() + ") has no incremental decoding on the " + backend_.name() +
         " backend";
}

std::vector<std::int32_t> TokenGenerator::generate(const std::vector<std::int32_t>& prompt, std::int64_t max_new_tokens,
                                                   const SamplingOptions& options, DecodingPath path,
                                                   const std::function<void(std::int32_t)>& on_token) {
  HPCTRAIN_ASSERT(!prompt.empty(), "an empty prompt");
  HPCTRAIN_ASSERT(path == DecodingPath::recomputed || cache_unavailable_reason().empty(),
                  "the cached path on " << cache_unavailable_reason());
  const std::int64_t window = model_.positions(), classes = model_.classes();
  const StepContext context{&backend_, false, options.seed, 0, nullptr, 1};
  BackendBuffer wide(backend_, static_cast<std::size_t>(window * classes) * sizeof(float));  // logits in fp32
  std::vector<float> logits(static_cast<std::size_t>(classes));
  std::vector<std::int32_t> tokens = prompt;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(window), 0);  // the window, zero-padded to T
  std::int64_t cached = 0;  // positions the layers' caches hold (cached path, before the window slides)
  for (std::int64_t step = 0; step < max_new_tokens; ++step) {
    const auto length = static_cast<std::int64_t>(tokens.size());
    const std::int64_t start = std::max<std::int64_t>(0, length - window), filled = length - start;
    std::copy(tokens.begin() + start, tokens.end(), ids.begin());
    backend_.copy_to_backend(model_.token_ids(), ids.data(), ids.size() * sizeof(std::int32_t));
    TensorView output{};
    std::int64_t row = 0;  // the row of `output` that holds the last position's logits
    if (path == DecodingPath::cached) {
      // After a slide every position holds another token: recompute the window (its caches included).
      const std::int64_t first = start > 0 ? 0 : cached;
      output = model_.forward_positions(context, first, filled - first);
      cached = filled;
      row = filled - first - 1;
    } else {
      // Causal layers: the zero padding after the last id does not change the logits at the positions before it.
      output = model_.forward(context);
      output = {output.data, output.dtype, window, classes};
      row = filled - 1;
    }
    backend_.cast(output, {wide.data, DType::f32, output.rows, classes});
    backend_.copy_to_host(logits.data(), wide.as<float>() + row * classes, logits.size() * sizeof(float));
    const std::int32_t next = sample_token(logits.data(), classes, options, static_cast<std::uint64_t>(length));
    tokens.push_back(next);
    if (on_token) on_token(next);
  }
  return tokens;
}

}  // namespace hpctrain
