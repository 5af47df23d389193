// `hpctrain data bench`: how fast every rank reads its training batches, as 'hpctrain train' would.
#include <algorithm>
#include <cstdio>
#include <optional>

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
    "median rate in samples per second. When K covers more than an epoch, also the first epoch's throughput and the\n"
    "later epochs' apart (the first also builds the file maps' page tables). Last, how much of rank 0's memory map of\n"
    "the features the kernel maps 2 MiB at a time (random rows read far faster where it does: docs/data.md).\n"
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
  // The first epoch apart from the later ones: it also builds this process's page tables of the files' maps.
  const std::int64_t first_epoch_steps = std::min(steps, loader.steps_per_epoch());
  std::int64_t rows = 0, first_epoch_rows = 0;
  double first_epoch_seconds = 0.0;
  const double start = MPI_Wtime();
  for (std::int64_t step = 0; step < steps; ++step) {
    rows += loader.next().rows;
    if (step + 1 == first_epoch_steps) {
      first_epoch_seconds = MPI_Wtime() - start;
      first_epoch_rows = rows;
    }
  }
  const double seconds = MPI_Wtime() - start;

  // Rank 0 prints every rank's figures: (staging s, staged bytes, seconds, bytes, first epoch's seconds and bytes).
  constexpr int figures_per_rank = 6;
  const double mine[figures_per_rank] = {staging,
                                         static_cast<double>(data.rows_in_memory() * row_bytes),
                                         seconds,
                                         static_cast<double>(rows * row_bytes),
                                         first_epoch_seconds,
                                         static_cast<double>(first_epoch_rows * row_bytes)};
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
    std::vector<double> rates, staging_rates, first_epoch_rates, later_epoch_rates;
    const bool later_epochs = steps > first_epoch_steps;
    for (int rank = 0; rank < mpi.size(); ++rank) {
      const double* figures = all.data() + static_cast<std::ptrdiff_t>(figures_per_rank) * rank;
      const double rate = figures[3] / std::max(figures[2], 1e-12) / 1e6;
      rates.push_back(rate);
      first_epoch_rates.push_back(figures[5] / std::max(figures[4], 1e-12) / 1e6);
      later_epoch_rates.push_back((figures[3] - figures[5]) / std::max(figures[2] - figures[4], 1e-12) / 1e6);
      std::printf("rank %d: staging %.1f MB in %.3f s", rank, figures[1] / 1e6, figures[0]);
      if (figures[1] > 0) {
        staging_rates.push_back(figures[1] / std::max(figures[0], 1e-12) / 1e6);
        std::printf(" (%.1f MB/s)", staging_rates.back());
      }
      std::printf(", then read %.1f MB of batches in %.3f s: %.1f MB/s\n", figures[3] / 1e6, figures[2], rate);
    }
    if (!staging_rates.empty()) std::printf("median per-rank staging throughput: %.1f MB/s\n", median(staging_rates));
    std::printf("median per-rank read throughput: %.1f MB/s\n", median(rates));
    if (later_epochs) {
      std::printf("median per-rank first-epoch throughput: %.1f MB/s\n", median(first_epoch_rates));
      std::printf("median per-rank later-epochs throughput: %.1f MB/s\n", median(later_epoch_rates));
    }
    std::printf("median per-rank read rate: %.0f samples/s\n", median(rates) * 1e6 / static_cast<double>(row_bytes));
    // Random rows read several times faster where the kernel maps the file 2 MiB at a time, which it does when the page
    // cache holds the file in large folios (Linux 6.16+ with ext4, or xfs: a file read from storage, or written in
    // whole 2 MiB pieces as hpctrain's writers do; not a cp copy): say which case this is.
    if (const std::optional<PageMapping> pages = data.feature_map_pages(); pages && pages->resident_bytes > 0) {
      const double huge = static_cast<double>(pages->huge_bytes) / static_cast<double>(pages->resident_bytes);
      std::printf("rank 0's memory map of the features: %.1f MB resident, %.0f%% of it in 2 MiB page-table entries%s\n",
                  static_cast<double>(pages->resident_bytes) / 1e6, 100 * huge,
                  huge < 0.5 ? " (the page cache holds the file in small pages, as a file copied on this node or "
                               "written in small pieces: see 'Direct reads' in docs/data.md)"
                             : "");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace hpctrain
