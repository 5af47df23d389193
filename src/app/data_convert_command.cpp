// `hpctrain data convert`: an HDF5 data file from NumPy .npy arrays or a CSV file, written by rank 0.
#include <cstdio>

#include "hpctrain/app/command_line.hpp"
#include "data_tools.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/data/convert.hpp"
#include "hpctrain/dist/mpi_environment.hpp"

namespace hpctrain {

namespace {

const char* const convert_usage =
    "usage: hpctrain data convert --features X.npy (--labels Y.npy | --targets T.npy) --output FILE.h5 [options]\n"
    "       hpctrain data convert --csv FILE.csv (--label-column COL | --target-column COL) [--header]\n"
    "                             --output FILE.h5 [options]\n"
    "\n"
    "Write an HDF5 data file in hpctrain's layout from NumPy .npy arrays or a CSV file of numbers.\n"
    "\n"
    ".npy: the features keep their element type (float16/32/64, int8..64, uint8..64) and shape (N, ...); labels\n"
    "(N) or (N, 1) whole numbers become /labels int32; targets (N) or (N, K) become /targets float32. C order only.\n"
    "CSV: comma-separated numbers, one sample per line; the chosen column becomes /labels (N) int32 (whole numbers)\n"
    "or /targets (N, 1) float32, every other column /features (N, F) float32. Empty lines are skipped.\n"
    "\n"
    "options:\n"
    "  --features X.npy        features, shape (N, ...) with at least 2 dimensions\n"
    "  --labels Y.npy          class labels\n"
    "  --targets T.npy         regression targets\n"
    "  --csv FILE.csv          a CSV file instead of .npy arrays\n"
    "  --label-column COL      CSV: the class label column, by header name or index counted from 0 (-1 = last)\n"
    "  --target-column COL     CSV: a regression target column instead\n"
    "  --header                CSV: the first line names the columns\n"
    "  --output FILE.h5        file to write (required); written as FILE.h5.partial and renamed when complete\n"
    "  --compress              gzip level 4 with the shuffle filter (smaller files, slower random reads)\n"
    "  --force                 replace FILE.h5 if it exists\n"
    "\n"
    "Datasets are chunked along the sample axis in chunks of about 1 MiB of whole samples.\n";

}  // namespace

int data_convert_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string command = "hpctrain data convert";
  const CommandLine parsed(args, command,
                           {{"--features", true},
                            {"--labels", true},
                            {"--targets", true},
                            {"--csv", true},
                            {"--label-column", true},
                            {"--target-column", true},
                            {"--header", false},
                            {"--output", true},
                            {"--compress", false},
                            {"--force", false}});
  if (print_help_if_asked(parsed, convert_usage, mpi)) return 0;
  const std::string help_hint = parsed.help_hint();
  HPCTRAIN_VERIFY(parsed.positionals().empty(), InputError,
                  command << ": unexpected argument '" << parsed.positionals()[0] << "'", help_hint);
  HPCTRAIN_VERIFY(parsed.has("--output"), InputError, command << ": --output FILE.h5 is required", help_hint);
  const bool csv = parsed.has("--csv");
  if (csv) {
    for (const char* option : {"--features", "--labels", "--targets"})
      HPCTRAIN_VERIFY(!parsed.has(option), InputError, command << ": " << option << " is for .npy input, not --csv",
                      help_hint);
    HPCTRAIN_VERIFY(parsed.has("--label-column") != parsed.has("--target-column"), InputError,
                    command << ": --csv needs exactly one of --label-column and --target-column", help_hint);
  } else {
    HPCTRAIN_VERIFY(parsed.has("--features"), InputError,
                    command << ": give --features X.npy with --labels or --targets, or --csv FILE.csv", help_hint);
    HPCTRAIN_VERIFY(parsed.has("--labels") != parsed.has("--targets"), InputError,
                    command << ": give exactly one of --labels Y.npy and --targets T.npy", help_hint);
    for (const char* option : {"--label-column", "--target-column", "--header"})
      HPCTRAIN_VERIFY(!parsed.has(option), InputError, command << ": " << option << " is for --csv input", help_hint);
  }
  const std::string output = parsed.value("--output");
  const bool compress = parsed.has("--compress");
  if (mpi.is_root()) {
    std::string summary;
    write_output_file(parsed, "--output", output, [&](const std::string& partial) {
      summary = with_command_context(command, [&] {
        if (csv) {
          CsvConversion conversion;
          conversion.csv = parsed.value("--csv");
          conversion.targets = parsed.has("--target-column");
          conversion.label_column = parsed.value(conversion.targets ? "--target-column" : "--label-column");
          conversion.header = parsed.has("--header");
          conversion.compress = compress;
          return convert_csv(conversion, partial);
        }
        NpyConversion conversion;
        conversion.features = parsed.value("--features");
        conversion.answers_are_labels = parsed.has("--labels");
        conversion.answers = parsed.value(conversion.answers_are_labels ? "--labels" : "--targets");
        conversion.compress = compress;
        return convert_npy(conversion, partial);
      });
    });
    summary = naming_outputs(summary, {output});
    std::printf("%s\n", summary.c_str());
    std::fflush(stdout);
  }
  wait_for_root(mpi);
  return 0;
}

}  // namespace hpctrain
