// No allocation in the training step: every malloc/calloc/realloc (operator new goes through malloc) is counted
// while TrainingStep::run (the trainer's step: upload, forward, loss, backward with the bucketed all-reduce, gradient
// statistics, the fused optimizer, the scaler update and the step's record) runs, for fp32 and bf16, with gradient
// accumulation, for a language model with attention (token batches, the fused attention kernels) and for a vision
// transformer (images: a patch conv2d channels-last, to_sequence, a non-causal transformer_block, sequence_pool). The
// first steps may allocate (oneDNN primitives, scratch growth); steps after them must not — except inside the
// libraries: oneDNN 2.6 builds a small argument map on every primitive execution (its execution context), and Open
// MPI's libnbc builds a schedule for every MPI_Iallreduce; their APIs give no way to avoid either. Allocations whose
// call stack passes through libdnnl or Open MPI are counted apart and reported; every other allocation fails the test.
// (Writing metrics.h5 rows allocates inside libhdf5; that is rank 0's logging, outside the step.)
#include <dlfcn.h>
#include <execinfo.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <tuple>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/dist/gradient_allreduce.hpp"
#include "hpctrain/kernels/backend_buffer.hpp"
#include "hpctrain/nn/model.hpp"
#include "hpctrain/optim/optimizer.hpp"
#include "hpctrain/precision/loss_scaler.hpp"
#include "hpctrain/train/device_batch.hpp"
#include "hpctrain/train/step_records.hpp"
#include "hpctrain/train/training_step.hpp"

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};          // outside oneDNN: must stay 0
std::atomic<long> library_allocations{0};  // inside oneDNN's primitive execution or Open MPI's collectives
thread_local bool classifying = false;     // backtrace() and dladdr() may allocate themselves

void count_allocation() {
  if (!counting.load(std::memory_order_relaxed) || classifying) return;
  classifying = true;
  void* frames[24];
  const int depth = backtrace(frames, 24);
  bool in_library = false;
  for (int i = 1; i < depth && !in_library; ++i) {
    Dl_info info;
    if (dladdr(frames[i], &info) == 0 || info.dli_fname == nullptr) continue;
    in_library = std::strstr(info.dli_fname, "libdnnl") || std::strstr(info.dli_fname, "openmpi") ||
                 std::strstr(info.dli_fname, "libmpi") || std::strstr(info.dli_fname, "libopen-pal");
  }
  (in_library ? library_allocations : allocations).fetch_add(1, std::memory_order_relaxed);
  classifying = false;
}
}  // namespace

extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* malloc(std::size_t size) {
  count_allocation();
  return __libc_malloc(size);
}
void* calloc(std::size_t count, std::size_t size) {
  count_allocation();
  return __libc_calloc(count, size);
}
void* realloc(void* pointer, std::size_t size) {
  count_allocation();
  return __libc_realloc(pointer, size);
}
}

namespace hpctrain {
namespace {

LayerSpec layer(const std::string& type, std::int64_t out = 0) {
  LayerSpec spec;
  spec.type = *choice_named<LayerType>(type);
  spec.name = type + std::to_string(out);
  spec.out = out;
  spec.p = 0.1;
  return spec;
}

// The model of a case: an MLP on features, a language model (embedding -> attention -> layernorm -> linear on
// sequences of `features` tokens) or a vision transformer on (3, 8, 8) images.
enum class Network { mlp, language, vision };

// (dtype, micro-batches per step, class weights and label smoothing: the per-step sum of the labels' weights, network)
class StepAllocations : public testing::TestWithParam<std::tuple<DType, std::int64_t, bool, Network>> {};

TEST_P(StepAllocations, NoneAfterWarmUp) {
  const auto [dtype, accumulate, weighted, network] = GetParam();
  const bool sequence = network == Network::language;
  const std::int64_t rows = 32, micro = rows / accumulate, vocabulary = 10;
  const SampleShape shape = network == Network::vision ? SampleShape{3, 8, 8} : SampleShape{16};
  const std::int64_t features = shape_size(shape);
  auto backend = make_cpu_backend();
  ModelSection spec;
  spec.layers = {layer("linear", 64), layer("layernorm"), layer("gelu"), layer("dropout"), layer("linear", 10)};
  if (sequence) {
    spec.layers = {layer("embedding", 16), layer("attention"), layer("layernorm"), layer("linear", vocabulary)};
    spec.layers[0].vocabulary = vocabulary;
    spec.layers[0].positions = true;
    spec.layers[1].heads = 2;
  }
  if (network == Network::vision) {
    LayerSpec patches = layer("conv2d", 16), tokens = layer("to_sequence"), block = layer("transformer_block");
    patches.kernel = patches.stride = {4};
    tokens.class_token = tokens.positions = true;
    block.heads = 2;
    block.causal = false;
    spec.layers = {patches, tokens, block, layer("layernorm"), layer("sequence_pool"), layer("linear", vocabulary)};
  }
  if (weighted) {
    spec.class_weights = {0.5, 1, 2, 1, 1, 3, 1, 1, 0.25, 1};
    spec.label_smoothing = 0.1;
  }
  Model model(spec, shape, *backend, {dtype, DType::f32, micro}, "test.toml");
  model.initialize(1);
  OptimizerSection section;
  Optimizer optimizer(section, model, *backend);
  std::vector<std::int64_t> layer_begins;
  for (std::size_t i = 0; i < model.layer_count(); ++i) layer_begins.push_back(model.parameter_begin(i));
  GradientAllreduce allreduce(MPI_COMM_WORLD, static_cast<float*>(model.gradients()), model.parameter_count(),
                              layer_begins, 4096);
  DeviceBatch device(*backend, model, micro);
  PrecisionSection precision;
  LossScaler scaler(precision, *backend);
  PhaseTimer timer(false);
  TrainingStep training_step(*backend, model, optimizer, allreduce, scaler, device, micro, MPI_COMM_WORLD, 1, timer);
  StepGraph graph(*backend, false, 0);
  StepRecords records(*backend, 1);

  HostBatch batch;
  batch.rows = rows;
  std::mt19937 generator(3);
  std::normal_distribution<float> normal;
  for (std::int64_t i = 0; i < rows * features; ++i) {
    if (sequence) {
      batch.tokens.push_back(static_cast<std::int32_t>(generator() % vocabulary));
      batch.token_targets.push_back(static_cast<std::int32_t>(generator() % vocabulary));
    } else {
      batch.features.push_back(normal(generator));
    }
  }
  for (std::int64_t i = 0; i < rows; ++i) {
    if (!sequence) batch.labels.push_back(static_cast<std::int32_t>(generator() % vocabulary));
    batch.sample_ids.push_back(i);
  }
  long after_warm_up = 0;
  for (int step = 0; step < 12; ++step) {
    if (step == 3) {
      allocations = 0;
      library_allocations = 0;
      counting = true;
    }
    training_step.run(batch, step, 1e-3f, graph, records, 0.0, 0.0);
    counting = false;  // reading the results back (the trainer's logging) is outside the step
    const FlushedSteps flushed = records.flush(MPI_COMM_WORLD, 0.0);
    ASSERT_EQ(flushed.steps.size(), 1u);
    ASSERT_TRUE(std::isfinite(flushed.steps[0].loss));
    counting = step >= 3;
  }
  counting = false;
  after_warm_up = allocations.load();
  EXPECT_EQ(after_warm_up, 0) << after_warm_up << " allocations in 9 steps after the warm-up (" << dtype_name(dtype)
                              << ", accumulate " << accumulate << (weighted ? ", class weights" : "")
                              << (sequence ? ", attention" : "") << (network == Network::vision ? ", vision" : "")
                              << ")";
  std::printf("%s, accumulate %lld%s%s: in 9 steps, %ld allocations by hpctrain, %ld inside oneDNN / Open MPI\n",
              dtype_name(dtype), static_cast<long long>(accumulate), weighted ? ", class weights" : "",
              sequence ? ", attention" : (network == Network::vision ? ", vision transformer" : ""), after_warm_up,
              library_allocations.load());
  // The counter works: an allocation while counting is seen.
  counting = true;
  void* volatile probe = std::malloc(64);
  counting = false;
  std::free(probe);
  EXPECT_EQ(allocations.load(), after_warm_up + 1);
}

INSTANTIATE_TEST_SUITE_P(Precisions, StepAllocations,
                         testing::Values(std::tuple{DType::f32, std::int64_t{1}, false, Network::mlp},
                                         std::tuple{DType::bf16, std::int64_t{1}, false, Network::mlp},
                                         std::tuple{DType::f32, std::int64_t{4}, false, Network::mlp},
                                         std::tuple{DType::f32, std::int64_t{2}, true, Network::mlp},
                                         std::tuple{DType::f32, std::int64_t{2}, false, Network::language},
                                         std::tuple{DType::bf16, std::int64_t{1}, false, Network::language},
                                         std::tuple{DType::bf16, std::int64_t{2}, false, Network::vision}));

}  // namespace
}  // namespace hpctrain
