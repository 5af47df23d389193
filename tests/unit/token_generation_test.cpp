// hpctrain generate's pieces: the sampler (greedy, temperature, top-k, one counter-based draw per (seed, position))
// against a long-double softmax and against the frequencies of many draws; and incremental decoding
// (Model::forward_positions: the prompt in one call, then one position per call) against the full forward pass, in
// double precision through the real layer code, with the generator's cached and recomputed paths giving the same ids.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "../../src/nn/layer_internal.hpp"
#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/kernels/backend.hpp"
#include "hpctrain/nn/generation.hpp"
#include "hpctrain/nn/model.hpp"

namespace hpctrain {
namespace {

std::vector<float> random_logits(std::int64_t vocabulary, unsigned seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(static_cast<std::size_t>(vocabulary));
  for (float& logit : logits) logit = normal(generator);
  return logits;
}

// softmax(logits / temperature) over the ids in `kept`, in long double.
std::vector<long double> reference_softmax(const std::vector<float>& logits, double temperature,
                                           const std::vector<std::size_t>& kept) {
  std::vector<long double> p(logits.size(), 0.0L);
  long double total = 0.0L;
  for (std::size_t id : kept) total += p[id] = std::exp(static_cast<long double>(logits[id]) / temperature);
  for (long double& value : p) value /= total;
  return p;
}

TEST(Sampler, TemperatureScalesTheSoftmax) {
  const std::vector<float> logits = random_logits(50, 1);
  std::vector<std::size_t> all(logits.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  for (double temperature : {1.0, 0.5, 2.5}) {
    const std::vector<double> p = sampling_distribution(logits.data(), 50, {temperature, 0, 1});
    const std::vector<long double> expected = reference_softmax(logits, temperature, all);
    long double error = 0, norm = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      ASSERT_FALSE(std::isnan(p[i]));
      error += (p[i] - expected[i]) * (p[i] - expected[i]);
      norm += expected[i] * expected[i];
    }
    EXPECT_LT(std::sqrt(error / norm), 1e-13) << "temperature " << temperature;
  }
}

TEST(Sampler, TopKKeepsTheLargestLogits) {
  std::vector<float> logits = random_logits(40, 2);
  logits[7] = logits[9] = 10.0f;  // a tie at the top: both kept before anything else
  for (std::int64_t k : {1, 2, 5, 40}) {
    const std::vector<double> p = sampling_distribution(logits.data(), 40, {0.8, k, 1});
    std::vector<std::size_t> order(logits.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
    order.resize(static_cast<std::size_t>(k));
    const std::vector<long double> expected = reference_softmax(logits, 0.8, order);
    std::int64_t nonzero = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      nonzero += p[i] > 0.0;
      EXPECT_NEAR(p[i], static_cast<double>(expected[i]), 1e-14) << "k " << k << ", id " << i;
    }
    EXPECT_EQ(nonzero, k);
    if (k == 1) EXPECT_EQ(p[7], 1.0);  // the lower id of the tie
  }
}

TEST(Sampler, GreedyIsTheArgmaxWhateverTheSeed) {
  std::vector<float> logits = random_logits(30, 3);
  logits[12] = logits[20] = 9.0f;
  for (std::uint64_t seed : {0u, 1u, 99u})
    for (std::uint64_t position : {0u, 5u, 1000u})
      EXPECT_EQ(sample_token(logits.data(), 30, {0.0, 0, seed}, position), 12);
}

TEST(Sampler, DeterministicPerSeedAndPosition) {
  const std::vector<float> logits(20, 0.0f);  // uniform: every draw shows the random number
  std::vector<std::int32_t> a, b, c;
  for (std::uint64_t position = 0; position < 200; ++position) {
    a.push_back(sample_token(logits.data(), 20, {1.0, 0, 7}, position));
    b.push_back(sample_token(logits.data(), 20, {1.0, 0, 7}, position));
    c.push_back(sample_token(logits.data(), 20, {1.0, 0, 8}, position));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Sampler, DrawsFollowTheDistribution) {
  constexpr std::int64_t vocabulary = 8, draws = 40000;
  const std::vector<float> logits = random_logits(vocabulary, 4);
  const SamplingOptions options{0.9, 6, 11};
  const std::vector<double> p = sampling_distribution(logits.data(), vocabulary, options);
  std::vector<double> counts(vocabulary, 0.0);
  for (std::int64_t position = 0; position < draws; ++position)
    ++counts[static_cast<std::size_t>(
        sample_token(logits.data(), vocabulary, options, static_cast<std::uint64_t>(position)))];
  for (std::int64_t id = 0; id < vocabulary; ++id) {
    const double expected = p[static_cast<std::size_t>(id)] * draws;
    const double sigma = std::sqrt(std::max(expected * (1.0 - p[static_cast<std::size_t>(id)]), 1e-9));
    if (expected == 0.0)
      EXPECT_EQ(counts[static_cast<std::size_t>(id)], 0.0) << "id " << id << " is outside the top k";
    else
      EXPECT_LT(std::abs(counts[static_cast<std::size_t>(id)] - expected), 5.0 * sigma) << "id " << id;
  }
}

TEST(Sampler, NonFiniteLogitsAreAnError) {
  std::vector<float> logits(10, 1.0f);
  logits[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(sample_token(logits.data(), 10, {1.0, 0, 1}, 0), NumericsError);
}

// ---- incremental decoding ----

constexpr std::int64_t window = 6, vocabulary = 11, width = 8;

LayerSpec layer(LayerType type, std::int64_t out = 0) {
  LayerSpec spec;
  spec.type = type;
  spec.name = std::string(word_of(type)) + std::to_string(out);
  spec.out = out;
  spec.vocabulary = vocabulary;
  spec.positions = true;
  spec.p = 0.2;
  return spec;
}

// Position-wise layers; with_attention: a causal attention (2 heads, its keys and values cached) after the layernorm.
std::vector<LayerSpec> decoding_layers(bool with_attention) {
  std::vector<LayerSpec> layers{layer(LayerType::embedding, width), layer(LayerType::layernorm)};
  if (with_attention) {
    layers.push_back(layer(LayerType::attention));
    layers.back().heads = 2;
    layers.back().causal = true;
  }
  for (const LayerSpec& spec : {layer(LayerType::linear, width), layer(LayerType::gelu), layer(LayerType::dropout),
                                layer(LayerType::linear, vocabulary)})
    layers.push_back(spec);
  return layers;
}

struct DecodingModel {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  Model model;
  explicit DecodingModel(bool with_attention)
      : model(ModelSection{decoding_layers(with_attention)}, SampleShape{window}, *backend,
              {DType::f64, DType::f64, 1, false, 0, true}, "test.toml") {
    model.initialize(5);
  }
};

class IncrementalDecoding : public ::testing::TestWithParam<bool> {};  // with an attention layer or not

TEST_P(IncrementalDecoding, PositionsMatchTheFullForward) {
  DecodingModel test(GetParam());
  Model& model = test.model;
  ASSERT_EQ(model.layer_without_incremental_decoding(), nullptr);
  const std::vector<std::int32_t> ids{3, 9, 0, 10, 4, 7};
  test.backend->copy_to_backend(model.token_ids(), ids.data(), ids.size() * sizeof(std::int32_t));
  const StepContext context{test.backend.get(), false, 1, 0, nullptr, 1};
  model.forward(context);
  const std::vector<double> full(static_cast<const double*>(model.output(1).data),
                                 static_cast<const double*>(model.output(1).data) + window * vocabulary);
  // The prompt (3 positions) in one call, then one position per call, on outputs poisoned with NaN.
  std::vector<double> incremental;
  for (const auto& [first, count] : {std::pair<std::int64_t, std::int64_t>{0, 3}, {3, 1}, {4, 1}, {5, 1}}) {
    std::fill_n(static_cast<double*>(model.output(1).data), window * vocabulary, std::nan(""));
    const TensorView logits = model.forward_positions(context, first, count);
    ASSERT_EQ(logits.rows, count);
    ASSERT_EQ(logits.cols, vocabulary);
    incremental.insert(incremental.end(), logits.as<double>(), logits.as<double>() + count * vocabulary);
  }
  double error = 0, norm = 0;
  for (std::size_t i = 0; i < full.size(); ++i) {
    ASSERT_FALSE(std::isnan(incremental[i])) << i;
    error += (incremental[i] - full[i]) * (incremental[i] - full[i]);
    norm += full[i] * full[i];
  }
  EXPECT_LT(std::sqrt(error / norm), 1e-14);
}

TEST_P(IncrementalDecoding, CachedAndRecomputedGenerateTheSameIds) {
  DecodingModel test(GetParam());
  TokenGenerator generator(test.model, *test.backend);
  ASSERT_EQ(generator.cache_unavailable_reason(), "");
  // 2 + 12 ids: the window of 6 slides after the fourth new id.
  for (const SamplingOptions& options :
       {SamplingOptions{1.0, 0, 3}, SamplingOptions{0.0, 0, 3}, SamplingOptions{1.5, 4, 9}}) {
    std::vector<std::int32_t> streamed;
    const auto cached =
        generator.generate({1, 2}, 12, options, DecodingPath::cached, [&](std::int32_t id) { streamed.push_back(id); });
    const auto recomputed = generator.generate({1, 2}, 12, options, DecodingPath::recomputed, nullptr);
    ASSERT_EQ(cached.size(), 14u);
    EXPECT_EQ(cached, recomputed);
    EXPECT_EQ(std::vector<std::int32_t>(cached.begin() + 2, cached.end()), streamed);
    for (std::int32_t id : cached) EXPECT_TRUE(id >= 0 && id < vocabulary);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, IncrementalDecoding, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WithAttention" : "PositionWise";
                         });

// The cache's one-query attention against the backend's fused attention over the whole sequence: the prompt's
// positions in one call, then one position per call, in f64 and f32.
TEST(CachedAttention, MatchesTheFusedKernel) {
  constexpr std::int64_t sequence = 9, heads = 2, head_dim = 4, width = heads * head_dim;
  const AttentionGeometry geometry{1, sequence, heads, head_dim, true, 0.5f, {}};
  auto backend = make_cpu_backend();
  std::mt19937 generator(6);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> qkv(sequence * 3 * width);
  for (double& value : qkv) value = normal(generator);
  for (DType dtype : {DType::f64, DType::f32}) {
    const double tolerance = dtype == DType::f64 ? 1e-13 : 1e-5;
    auto as_dtype = [&](const std::vector<double>& values) {
      std::vector<char> bytes(values.size() * dtype_size(dtype));
      for (std::size_t i = 0; i < values.size(); ++i)
        if (dtype == DType::f64)
          reinterpret_cast<double*>(bytes.data())[i] = values[i];
        else
          reinterpret_cast<float*>(bytes.data())[i] = static_cast<float>(values[i]);
      return bytes;
    };
    auto value = [&](const std::vector<char>& bytes, std::size_t i) {
      return dtype == DType::f64 ? reinterpret_cast<const double*>(bytes.data())[i]
                                 : static_cast<double>(reinterpret_cast<const float*>(bytes.data())[i]);
    };
    std::vector<char> packed = as_dtype(qkv), fused(sequence * width * dtype_size(dtype));
    std::vector<double> lse(heads * sequence);
    backend->attention_forward(geometry, {packed.data(), dtype, sequence, 3 * width},
                               {fused.data(), dtype, sequence, width}, lse.data());
    // the cache: k and v of each position (qkv's columns [C, 3C)), as the backend appends them
    std::vector<char> cache(sequence * 2 * width * dtype_size(dtype));
    const std::size_t size = dtype_size(dtype);
    for (std::int64_t p = 0; p < sequence; ++p)
      std::copy_n(packed.data() + (p * 3 * width + width) * size, 2 * width * size,
                  cache.data() + p * 2 * width * size);
    std::vector<double> error_sum(1, 0.0), norm(1, 0.0);
    for (const auto& [first, count] : {std::pair<std::int64_t, std::int64_t>{0, 4}, {4, 1}, {5, 3}, {8, 1}}) {
      std::vector<char> out = as_dtype(std::vector<double>(count * width, std::nan("")));
      backend->cached_attention(geometry, {packed.data() + first * 3 * width * size, dtype, count, 3 * width},
                                cache.data(), first, {out.data(), dtype, count, width});
      for (std::int64_t i = 0; i < count * width; ++i) {
        const double got = value(out, static_cast<std::size_t>(i)),
                     expected = value(fused, static_cast<std::size_t>(first * width + i));
        ASSERT_FALSE(std::isnan(got)) << "position " << first + i / width;
        error_sum[0] += (got - expected) * (got - expected);
        norm[0] += expected * expected;
      }
    }
    EXPECT_LT(std::sqrt(error_sum[0] / norm[0]), tolerance) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace hpctrain
