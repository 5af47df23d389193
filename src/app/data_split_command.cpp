// `hpctrain data split`: a training and a validation file from one data file, written by rank 0.
#include <cstdio>

#include "hpctrain/app/command_line.hpp"
#include "data_tools.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/data/convert.hpp"
#include "hpctrain/dist/mpi_environment.hpp"

namespace hpctrain {

namespace {

const char* const split_usage =
    "usage: hpctrain data split FILE.h5 --validation-fraction F --train-output A.h5 --validation-output B.h5\n"
    "                           [--seed S] [--shuffle] [--compress] [--force]\n"
    "\n"
    "Split every per-sample dataset of FILE.h5 (those with as many rows as /features) into a training and a\n"
    "validation file. The validation set is the first round(F x N) samples of torch.randperm(N) with a generator\n"
    "seeded with S (default 0): the same seed gives the same split. Values keep their stored types.\n"
    "\n"
    "options:\n"
    "  --validation-fraction F   share of the samples for validation, 0 < F < 1\n"
    "  --seed S                  seed of the random split (default 0)\n"
    "  --shuffle                 write the samples in random order (for data.shuffle = \"local\"); default: file "
    "order\n"
    "  --compress                gzip level 4 with the shuffle filter\n"
    "  --force                   replace existing output files\n";

}  // namespace

int data_split_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data split";
  const CommandLine parsed(args, command,
                           {{"--validation-fraction", true},
                            {"--seed", true},
                            {"--train-output", true},
                            {"--validation-output", true},
                            {"--shuffle", false},
                            {"--compress", false},
                            {"--force", false}});
  if (print_help_if_asked(parsed, split_usage, mpi)) return 0;
  const std::string help_hint = parsed.help_hint();
  HPCTRAIN_VERIFY(parsed.positionals().size() == 1, InputError,
                  command << ": " << (parsed.positionals().empty() ? "no input file given" : "one input file only"),
                  help_hint);
  for (const char* option : {"--validation-fraction", "--train-output", "--validation-output"})
    HPCTRAIN_VERIFY(parsed.has(option), InputError, command << ": " << option << " is required", help_hint);
  SplitRequest request;
  request.input = parsed.positionals()[0];
  request.validation_fraction = parsed.number("--validation-fraction");
  if (parsed.has("--seed")) request.seed = parsed.integer<std::uint64_t>("--seed");
  request.shuffle = parsed.has("--shuffle");
  request.compress = parsed.has("--compress");
  const std::string train_output = parsed.value("--train-output");
  const std::string validation_output = parsed.value("--validation-output");
  HPCTRAIN_VERIFY(
      train_output != validation_output && train_output != request.input && validation_output != request.input,
      InputError, command << ": the input and the two outputs must be three different files", help_hint);
  if (mpi.is_root()) {
    std::string summary;
    // Both outputs are written to temporary names; the second rename happens only when both are complete.
    write_output_file(parsed, "--train-output", train_output, [&](const std::string& train) {
      write_output_file(parsed, "--validation-output", validation_output, [&](const std::string& validation) {
        summary = with_command_context(command, [&] { return split_dataset(request, train, validation); });
      });
    });
    summary = naming_outputs(summary, {train_output, validation_output});
    std::printf("%s\n", summary.c_str());
    std::fflush(stdout);
  }
  wait_for_root(mpi);
  return 0;
}

}  // namespace hpctrain
