// `hpctrain data bench`: how fast every rank reads its training batches, as 'hpctrain train' would.
#include <algorithm>
#include <cstdio>

#include "data_tools.hpp"
#include "hpctrain/app/command_line.hpp"
#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"
#include "hpctrain/data/batch_loader.hpp"
#include "hpctrain/data/training_data.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/train/run_shape.hpp"

namespace hpctrain {

namespace {

const char* const bench_usage =
    "usage: mpiexec -n R hpctrain data bench DECK.toml [--steps K] [--set section.key=value]...\n"
    "\n"
    "Read the deck's training batches exactly as 'hpctrain train' would on this many ranks (same sampler, files,\n"
    "transforms, augmentation, data.prefetch, data.in_memory, data.shuffle), without training, and report per rank\n"
    "the staging time (data.in_memory, local shuffle) and the read throughput: bytes of batch data delivered (float32\n"
    "features, labels/targets; int32 input and target ids of token data) per second of waiting for batches, and the\n"
    "median rate in samples per second.\n"
    "\n"
    "options:\n"
    "  --steps K     batches to read per rank (default: one epoch)\n"
    "  --set k=v     override a deck key (repeatable), e.g. --set data.prefetch=0\n";

}  // namespace

int data_bench_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data bench";
  const CommandLine parsed(args, command, {{"--steps", true}, {"--set", true, true}});
  if (print_help_if_asked(parsed, bench_usage, mpi)) return 0;
  const std::string help_hint = parsed.help_hint();
  HPCTRAIN_VERIFY(parsed.positionals().size() == 1, InputError,
                  command << ": " << (parsed.positionals().empty() ? "no deck given" : "one deck only"), help_hint);
  const auto overrides = parsed.values("--set");
  const RunConfig config = load_run_config(parsed.positionals()[0], overrides);
  TrainingData data(config, "data.train", config.data.train, task_of(config.model.loss));
  data.set_up_augmentation(config);
  const std::int64_t local_batch = batch_shape(config, mpi.size()).local_batch;  // the trainer's checks

  const double staging_start = MPI_Wtime();
  BatchLoader loader(data, config.data, mpi, local_batch, config.run.seed);
  const double staging = MPI_Wtime() - staging_start;
  const std::int64_t steps = parsed.has("--steps") ? parsed.integer<std::int64_t>("--steps") : loader.steps_per_epoch();
  HPCTRAIN_VERIFY(steps >= 1, InputError, command << ": --steps must be at least 1", help_hint);
  // Token data: T input ids and T target ids per window, int32 each (4 bytes, as float32 features and labels).
  const std::int64_t row_bytes = data.holds_tokens()
                                     ? 2 * data.sequence_length() * static_cast<std::int64_t>(sizeof(std::int32_t))
                                     : data.feature_width() * static_cast<std::int64_t>(sizeof(float)) +
                                           data.target_width() * static_cast<std::int64_t>(sizeof(float));
  std::int64_t rows = 0;
  const double start = MPI_Wtime();
  for (std::int64_t step = 0; step < steps; ++step) rows += loader.next().rows;
  const double seconds = MPI_Wtime() - start;

  // Rank 0 prints every rank's figures: (staging s, staged bytes, seconds, bytes).
  constexpr int figures_per_rank = 4;
  const double mine[figures_per_rank] = {staging, static_cast<double>(data.rows_in_memory() * row_bytes), seconds,
                                         static_cast<double>(rows * row_bytes)};
  std::vector<double> all(static_cast<std::size_t>(figures_per_rank * mpi.size()));
  HPCTRAIN_MPI_CHECK(
      MPI_Gather(mine, figures_per_rank, MPI_DOUBLE, all.data(), figures_per_rank, MPI_DOUBLE, 0, mpi.world()));
  if (mpi.is_root()) {
    std::printf(
        "# hpctrain data bench: %s: %s, %lld samples of %lld bytes (%s), %d ranks x %lld steps of %lld; "
        "data.shuffle = %s, data.prefetch = %lld, data.in_memory = %s\n",
        parsed.positionals()[0].c_str(), data.file().c_str(), static_cast<long long>(data.samples()),
        static_cast<long long>(row_bytes), data.holds_tokens() ? "int32 token windows" : "float32", mpi.size(),
        static_cast<long long>(steps), static_cast<long long>(local_batch),
        std::string(word_of(config.data.shuffle)).c_str(), static_cast<long long>(config.data.prefetch),
        config.data.in_memory ? "true" : "false");
    if (const SampleAugmentation* augmentation = data.augmentation())
      std::printf("# training augmentation: %s\n", augmentation->description().c_str());
    std::vector<double> rates, staging_rates;
    for (int rank = 0; rank < mpi.size(); ++rank) {
      const double* figures = all.data() + figures_per_rank * rank;
      const double rate = figures[3] / std::max(figures[2], 1e-12) / 1e6;
      rates.push_back(rate);
      std::printf("rank %d: staging %.1f MB in %.3f s", rank, figures[1] / 1e6, figures[0]);
      if (figures[1] > 0) {
        staging_rates.push_back(figures[1] / std::max(figures[0], 1e-12) / 1e6);
        std::printf(" (%.1f MB/s)", staging_rates.back());
      }
      std::printf(", then read %.1f MB of batches in %.3f s: %.1f MB/s\n", figures[3] / 1e6, figures[2], rate);
    }
    if (!staging_rates.empty()) std::printf("median per-rank staging throughput: %.1f MB/s\n", median(staging_rates));
    std::printf("median per-rank read throughput: %.1f MB/s\n", median(rates));
    std::printf("median per-rank read rate: %.0f samples/s\n", median(rates) * 1e6 / static_cast<double>(row_bytes));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace hpctrain
