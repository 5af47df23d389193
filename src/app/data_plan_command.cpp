// `hpctrain data plan`: the samples each rank reads at each step of an epoch, printed by one process.
#include <algorithm>
#include <cstdio>

#include "data_tools.hpp"
#include "hpctrain/app/command_line.hpp"
#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/numbers.hpp"
#include "hpctrain/data/sampler.hpp"
#include "hpctrain/data/training_data.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/train/run_shape.hpp"

namespace hpctrain {

namespace {

const char* const plan_usage =
    "usage: hpctrain data plan DECK.toml --ranks R [--epoch E] [--steps K] [--set section.key=value]...\n"
    "\n"
    "Print, for one epoch of the deck's training data, the global sample indices each of R ranks reads at each step,\n"
    "in the order it reads them: one line per (step, rank). Runs on one process: no need to start R ranks.\n"
    "With data.shuffle = true the order is PyTorch's DistributedSampler's (randperm seeded with run.seed + epoch,\n"
    "padded or truncated to a multiple of R, rank r taking every R-th index from r), so a PyTorch run can be\n"
    "checked against it; the global batch of a step is the same set of samples for any R.\n"
    "\n"
    "options:\n"
    "  --ranks R     number of ranks (required)\n"
    "  --epoch E     the epoch (default 0)\n"
    "  --steps K     print only the first K steps\n"
    "  --set k=v     override a deck key, as for 'hpctrain train' (repeatable)\n";

}  // namespace

int data_plan_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data plan";
  const CommandLine parsed(args, command,
                           {{"--ranks", true}, {"--epoch", true}, {"--steps", true}, {"--set", true, true}});
  if (print_help_if_asked(parsed, plan_usage, mpi)) return 0;
  const std::string help_hint = parsed.help_hint();
  HPCTRAIN_VERIFY(parsed.positionals().size() == 1, InputError,
                  command << ": " << (parsed.positionals().empty() ? "no deck given" : "one deck only"), help_hint);
  HPCTRAIN_VERIFY(parsed.has("--ranks"), InputError, command << ": --ranks R is required", help_hint);
  const auto ranks = parsed.integer<std::int64_t>("--ranks");
  HPCTRAIN_VERIFY(ranks >= 1 && ranks <= (1 << 24), InputError, command << ": --ranks must be at least 1", help_hint);
  const std::int64_t epoch = parsed.has("--epoch") ? parsed.integer<std::int64_t>("--epoch") : 0;
  HPCTRAIN_VERIFY(epoch >= 0, InputError, command << ": --epoch must be >= 0", help_hint);
  const std::int64_t max_steps = parsed.has("--steps") ? parsed.integer<std::int64_t>("--steps") : INT64_MAX;
  const auto overrides = parsed.values("--set");
  const RunConfig config = load_run_config(parsed.positionals()[0], overrides);

  if (mpi.is_root()) {
    const TrainingData data(config, "data.train", config.data.train, task_of(config.model.loss));
    const int rank_count = static_cast<int>(ranks);
    const std::int64_t local_batch = batch_shape(config, rank_count).local_batch;
    const ShuffleMode mode = config.data.shuffle;
    std::vector<std::unique_ptr<Sampler>> samplers;
    std::vector<std::vector<std::int64_t>> orders;
    for (int rank = 0; rank < rank_count; ++rank) {
      samplers.push_back(make_sampler(mode, data.samples(), rank_count, rank, config.run.seed, config.data.drop_last));
      orders.push_back(samplers.back()->indices(epoch));
    }
    const std::int64_t per_rank = samplers.front()->samples_per_rank();
    const std::int64_t steps = steps_per_epoch(per_rank, local_batch, config.data.drop_last);
    const std::int64_t visited = per_rank * ranks;
    std::printf("# hpctrain data plan: %s, epoch %lld\n", parsed.positionals()[0].c_str(),
                static_cast<long long>(epoch));
    std::printf(
        "# data.train: %s: %lld samples; %lld ranks; global batch %lld = %lld x %lld; data.shuffle = %s; "
        "data.drop_last = %s; run.seed = %llu\n",
        data.file().c_str(), static_cast<long long>(data.samples()), static_cast<long long>(ranks),
        static_cast<long long>(config.data.batch_size), static_cast<long long>(ranks),
        static_cast<long long>(local_batch), std::string(word_of(mode)).c_str(),
        config.data.drop_last ? "true" : "false", static_cast<unsigned long long>(config.run.seed));
    std::printf("# %lld steps per epoch; %lld samples per rank", static_cast<long long>(steps),
                static_cast<long long>(per_rank));
    if (visited > data.samples()) {
      std::printf(" (%lld samples read twice as padding)", static_cast<long long>(visited - data.samples()));
    } else if (visited < data.samples()) {
      std::printf(" (%lld samples dropped this epoch)", static_cast<long long>(data.samples() - visited));
    }
    std::printf("\n");
    if (mode == ShuffleMode::local) {
      std::printf("# local shuffle: each rank reads only its slice:");
      for (int rank = 0; rank < rank_count; ++rank) {
        const auto [first, end] = rank_slice(data.samples(), rank_count, rank);
        std::printf(" rank %d [%lld, %lld)", rank, static_cast<long long>(first), static_cast<long long>(end));
      }
      std::printf("\n");
    }
    std::printf("# each line: step, rank, then the global sample indices that rank reads at that step, in order\n");
    std::string line;
    for (std::int64_t step = 0; step < std::min(steps, max_steps); ++step) {
      for (int rank = 0; rank < rank_count; ++rank) {
        const auto& order = orders[static_cast<std::size_t>(rank)];
        const std::int64_t first = step * local_batch;
        const std::int64_t end = std::min<std::int64_t>(first + local_batch, static_cast<std::int64_t>(order.size()));
        line = "step ";
        line += std::to_string(step);
        line += " rank ";
        line += std::to_string(rank);
        line += ':';
        for (std::int64_t i = first; i < end; ++i) {
          line += ' ';
          line += std::to_string(order[static_cast<std::size_t>(i)]);
        }
        std::puts(line.c_str());
      }
    }
    std::fflush(stdout);
  }
  wait_for_root(mpi);
  return 0;
}

}  // namespace hpctrain
